// The fingerprint of a model state: a 64-bit FNV-1a hash over every parameter
// and buffer (name, dtype, shape, bytes) in registration order, printed as 16
// hex digits. Two runs with equal fingerprints ended in bitwise-equal states.
#pragma once

#include <torch/nn/module.h>

#include <string>
#include <vector>

namespace vflow::engine {

std::string fingerprint(const torch::nn::Module& module);
/// The same hash continued over `extra` tensors (named "<extra_name>.<i>"), for state
/// that is part of the result beside the module's (the weight EMA); empty = the above.
std::string fingerprint(const torch::nn::Module& module, const std::vector<torch::Tensor>& extra,
                        const std::string& extra_name);

}  // namespace vflow::engine
