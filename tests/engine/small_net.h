// A small network for the reduction tests: layers in registration order a, unused, b, c,
// where `unused` gets no gradient (its part of the packet stays zero).
#pragma once

#include <torch/torch.h>

namespace vflow::testing {

struct SmallNet : torch::nn::Module {
  /// Seeds the global generator: make every rank's network before the ranks' threads start.
  SmallNet() {
    torch::manual_seed(5);
    a = register_module("a", torch::nn::Linear(8, 16));
    unused = register_module("unused", torch::nn::Linear(4, 4));
    b = register_module("b", torch::nn::Linear(16, 16));
    c = register_module("c", torch::nn::Linear(16, 4));
  }
  torch::Tensor loss(const torch::Tensor& x) {
    return c(torch::relu(b(torch::relu(a(x))))).pow(2).mean();
  }
  torch::nn::Linear a{nullptr}, unused{nullptr}, b{nullptr}, c{nullptr};
};

}  // namespace vflow::testing
