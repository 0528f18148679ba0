#include "vflow/data/dataset.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "vflow/core/error.h"
#include "vflow/data/fashion_mnist.h"
#include "vflow/data/synthetic.h"

namespace vflow::data {

TensorDataset::TensorDataset(torch::Tensor inputs, torch::Tensor targets, int64_t num_classes)
    : inputs_(std::move(inputs)), targets_(std::move(targets)), num_classes_(num_classes) {
  VFLOW_ASSERT(inputs_.dim() >= 1 && targets_.dim() == 1 && inputs_.size(0) == targets_.size(0),
               "inputs and targets must have the same number of examples");
  inputs_ = inputs_.contiguous();
  targets_ = targets_.to(torch::kInt64).contiguous();
}

DataInfo TensorDataset::info() const {
  DataInfo info;
  info.input_shape.assign(inputs_.sizes().begin() + 1, inputs_.sizes().end());
  info.num_classes = num_classes_;
  return info;
}

Batch TensorDataset::get(const torch::Tensor& indices) const {
  return Batch{inputs_.index_select(0, indices), targets_.index_select(0, indices)};
}

// ---- registry ------------------------------------------------------------------

namespace {

PreparedData prepare_fashion_mnist(OptionReader& opt) {
  const std::string path = opt.get_string("path", kFashionMnistDefaultPath);
  const bool normalize = opt.get_bool("normalize", true);
  PreparedData p;
  p.info = DataInfo{{1, 28, 28}, 10};
  p.load = [path, normalize] {
    return DataSplits{load_fashion_mnist(path, "train", normalize),
                      load_fashion_mnist(path, "test", normalize)};
  };
  return p;
}

PreparedData prepare_synthetic(OptionReader& opt) {
  SyntheticOptions train;
  train.size = opt.get_int("train_size", 4096, 1, int64_t{1} << 32);
  const int64_t test_size = opt.get_int("test_size", 1024, 0, int64_t{1} << 32);
  train.classes = opt.get_int("classes", 10, 2, 100000);
  train.shape = opt.get_int_list("shape", {1, 28, 28}, 1, 1 << 20);
  if (train.shape.empty()) opt.fail("shape", "needs at least one dimension");
  train.noise = opt.get_double("noise", 1.0, 0.0, 1e6);
  train.seed = static_cast<uint64_t>(opt.get_int("seed", 0, 0, INT64_MAX));
  SyntheticOptions test = train;
  test.size = test_size;
  test.split = 1;
  PreparedData p;
  p.info = DataInfo{train.shape, train.classes};
  p.load = [train, test] {
    return DataSplits{make_synthetic(train), test.size > 0 ? make_synthetic(test) : nullptr};
  };
  return p;
}

}  // namespace

DataRegistry::DataRegistry() : Registry("data set") {
  add("fashion-mnist", "Fashion-MNIST idx files (options: path, normalize)", prepare_fashion_mnist);
  add("synthetic",
      "class prototypes plus noise (options: train_size, test_size, classes, shape, noise, seed)",
      prepare_synthetic);
}

DataRegistry& DataRegistry::global() {
  static DataRegistry registry;
  return registry;
}

PreparedData DataRegistry::prepare(const std::string& name, const SpecNode& name_node,
                                   const SpecNode& options) const {
  const DataFactory& factory = find(name, name_node);
  OptionReader reader(options);
  PreparedData prepared = factory(reader);
  reader.finish();
  return prepared;
}

}  // namespace vflow::data
