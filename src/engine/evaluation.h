// Evaluation on a held-out split: the mean loss and top-1 accuracy of a model.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

#include "engine/example_reader.h"
#include "vflow/engine/trainer.h"

namespace vflow::engine {

/// `model` over every example of `test` (read through `reader`, as in epoch 0), in chunks of
/// `batch` examples on `device` (under bfloat16 autocast where `bf16`). With `average` not empty
/// (the weight average, in parameter order) the average takes the parameters' place while
/// evaluating and they are restored after. The model is left in training mode. EvalResult::step is
/// left 0.
EvalResult evaluate_model(models::Model& model, const data::Dataset& test,
                          const ExampleReader& reader, c10::Device device, bool bf16, int64_t batch,
                          const std::vector<at::Tensor>& average);

}  // namespace vflow::engine
