// The fingerprint of a model state: a 64-bit FNV-1a hash over every parameter
// and buffer (name, dtype, shape, bytes) in registration order, printed as 16
// hex digits. Two runs with equal fingerprints ended in bitwise-equal states.
#pragma once

#include <torch/nn/module.h>

#include <string>

namespace vflow::engine {

std::string fingerprint(const torch::nn::Module& module);

}  // namespace vflow::engine
