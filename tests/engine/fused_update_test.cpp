// The fused SGD and AdamW against LibTorch's own over 100 steps, and their checkpoints
// against LibTorch's format.
#include "engine/fused_update.h"

#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <condition_variable>
#include <mutex>
#include <sstream>
#include <thread>

#include "vflow/engine/runtime.h"
#include "vflow/engine/trainer.h"
#include "vflow/vnode/gradient_buffer.h"

using vflow::engine::OptimizerSpec;

namespace {

/// A small network with a frozen parameter, so that the fused optimizer skips what has
/// no gradient as LibTorch's does.
struct Net : torch::nn::Module {
  Net() {
    a = register_module("a", torch::nn::Linear(37, 64));
    b = register_module("b", torch::nn::Linear(64, 10));
    frozen = register_parameter("frozen", torch::randn({5}), /*requires_grad=*/false);
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
  torch::Tensor frozen;
};

/// The same network twice (equal parameters).
std::pair<std::shared_ptr<Net>, std::shared_ptr<Net>> twins() {
  torch::manual_seed(3);
  auto x = std::make_shared<Net>();
  auto y = std::make_shared<Net>();
  torch::NoGradGuard no_grad;
  const auto px = x->parameters();
  const auto py = y->parameters();
  for (size_t i = 0; i < px.size(); ++i) py[i].copy_(px[i]);
  return {x, y};
}

/// Step k's gradient for parameter i: the same for both networks, of varied sizes.
void set_gradients(Net& net, int k) {
  torch::manual_seed(1000 + k);
  for (auto& p : net.parameters()) {
    if (!p.requires_grad()) continue;
    const auto g = torch::randn(p.sizes()) * (k % 7 == 0 ? 0.5 : 0.05);
    if (p.grad().defined()) {
      p.mutable_grad().copy_(g);  // the flat buffer's view stays
    } else {
      p.mutable_grad() = g;
    }
  }
}

/// |a − b| ≤ 1e-6 |b| + 1e-6 on every element of every parameter. Two float32 orders of
/// the same arithmetic (LibTorch's kernels contract multiply-adds into FMAs where the CPU
/// has them; the fused ones never do) drift apart by rounding alone: over 100 steps of
/// these sizes each is up to 1.7e-6 from a float64 run, and they differ by up to 7e-7
/// from each other, on parameters of 0.01 to 1, so the absolute term is needed; an
/// error in the arithmetic (a missing decay, dampening or bias correction) is 1e-4 or
/// more.
void check_close(Net& fused, Net& reference) {
  const auto pf = fused.parameters();
  const auto pr = reference.parameters();
  for (size_t i = 0; i < pf.size(); ++i) {
    CAPTURE(i);
    const auto bound = pr[i].abs() * 1e-6 + 1e-6;
    const auto excess = ((pf[i] - pr[i]).abs() - bound).max().item<double>();
    const auto at = ((pf[i] - pr[i]).abs() - bound).argmax().item<int64_t>();
    CAPTURE(pf[i].reshape({-1})[at].item<double>(), pr[i].reshape({-1})[at].item<double>());
    CHECK(excess <= 0);
  }
}

OptimizerSpec spec_of(const std::string& name, double weight_decay) {
  OptimizerSpec s;
  s.name = name;
  s.lr = name == "sgd" ? 0.05 : 0.003;
  s.weight_decay = weight_decay;
  return s;
}

std::unique_ptr<torch::optim::Optimizer> libtorch_optimizer(const OptimizerSpec& s, Net& net) {
  if (s.name == "sgd") {
    return std::make_unique<torch::optim::SGD>(net.parameters(), torch::optim::SGDOptions(s.lr)
                                                                     .momentum(s.momentum)
                                                                     .dampening(s.dampening)
                                                                     .nesterov(s.nesterov)
                                                                     .weight_decay(s.weight_decay));
  }
  return std::make_unique<torch::optim::AdamW>(net.parameters(), torch::optim::AdamWOptions(s.lr)
                                                                     .betas({s.beta1, s.beta2})
                                                                     .eps(s.eps)
                                                                     .weight_decay(s.weight_decay));
}

struct Variant {
  std::string name;
  double weight_decay;
  double momentum;
  double dampening;
  bool nesterov;
};

/// The optimizer's spec of a variant.
OptimizerSpec spec_of(const Variant& v) {
  auto spec = spec_of(v.name, v.weight_decay);
  spec.momentum = v.momentum;
  spec.dampening = v.dampening;
  spec.nesterov = v.nesterov;
  return spec;
}

/// Intra-op threads for a scope.
class Threads {
 public:
  explicit Threads(int threads) : saved_(torch::get_num_threads()) {
    vflow::engine::set_intra_op_threads(threads);
  }
  ~Threads() { vflow::engine::set_intra_op_threads(saved_); }
  Threads(const Threads&) = delete;
  Threads& operator=(const Threads&) = delete;

 private:
  int saved_;
};

/// A weight over two parallel chunks of the update (2^14 elements each), so that
/// special elements can fall at a chunk's edges, and a bias, the same at every call.
std::shared_ptr<torch::nn::Module> two_parameters() {
  torch::manual_seed(5);
  auto net = std::make_shared<torch::nn::Module>();
  net->register_parameter("w", torch::randn({40000}) * 0.1);
  net->register_parameter("b", torch::randn({7}) * 0.1);
  return net;
}

/// An optimizer's state as a checkpoint's bytes, and back.
std::string saved(const torch::optim::Optimizer& o) {
  torch::serialize::OutputArchive archive;
  o.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}
void load(torch::optim::Optimizer& o, const std::string& bytes) {
  torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  archive.load_from(in);
  o.load(archive);
}

}  // namespace

TEST_CASE("the fused SGD and AdamW follow LibTorch's over 100 steps", "[unit]") {
  const auto variant =
      GENERATE(Variant{"sgd", 5e-4, 0.9, 0, true}, Variant{"sgd", 0, 0.9, 0.1, false},
               Variant{"sgd", 1e-3, 0, 0, false}, Variant{"adamw", 0.01, 0, 0, false},
               Variant{"adamw", 0, 0, 0, false});
  const bool flat_gradients = GENERATE(true, false);
  const int threads = GENERATE(1, 2);
  CAPTURE(variant.name, variant.weight_decay, variant.momentum, flat_gradients, threads);
  const Threads use(threads);
  const auto spec = spec_of(variant);
  auto [fused_net, reference_net] = twins();
  // The trainer's layout: every gradient a view into one flat buffer.
  std::unique_ptr<vflow::vnode::GradientBuffer> buffer;
  if (flat_gradients)
    buffer = std::make_unique<vflow::vnode::GradientBuffer>(fused_net->parameters());
  auto fused = vflow::engine::make_fused_optimizer(spec, fused_net->parameters());
  REQUIRE(fused != nullptr);
  auto reference = libtorch_optimizer(spec, *reference_net);
  for (int k = 0; k < 100; ++k) {
    // A schedule, as the trainer sets it every step.
    const double lr = spec.lr * (1.0 - 0.5 * k / 100.0);
    for (auto* o : {fused.get(), reference.get()}) {
      for (auto& g : o->param_groups()) g.options().set_lr(lr);
    }
    set_gradients(*fused_net, k);
    set_gradients(*reference_net, k);
    fused->step();
    reference->step();
  }
  check_close(*fused_net, *reference_net);
  // The frozen parameter is untouched.
  CHECK(torch::equal(fused_net->frozen, reference_net->frozen));
}

TEST_CASE("the fused optimizers' checkpoints are LibTorch's: each resumes the other", "[unit]") {
  const std::string name = GENERATE("sgd", "adamw");
  CAPTURE(name);
  const auto spec = spec_of(name, 1e-3);
  auto [fused_net, reference_net] = twins();
  auto fused = vflow::engine::make_fused_optimizer(spec, fused_net->parameters());
  auto reference = libtorch_optimizer(spec, *reference_net);
  for (int k = 0; k < 10; ++k) {
    set_gradients(*fused_net, k);
    set_gradients(*reference_net, k);
    fused->step();
    reference->step();
  }
  // Swap the states: the fused optimizer loads LibTorch's checkpoint and vice versa.
  const auto fused_bytes = saved(*fused);
  const auto reference_bytes = saved(*reference);
  load(*fused, reference_bytes);
  load(*reference, fused_bytes);
  // A parameter given storage of its own (as a model's load does) is bound back.
  {
    torch::NoGradGuard no_grad;
    auto& w = fused_net->a->weight;
    w.set_(w.detach().clone());
  }
  for (int k = 10; k < 20; ++k) {
    set_gradients(*fused_net, k);
    set_gradients(*reference_net, k);
    fused->step();
    reference->step();
  }
  check_close(*fused_net, *reference_net);
  // An optimizer that never stepped saves no state, as LibTorch's does.
  auto [fresh_net, unused] = twins();
  auto fresh = vflow::engine::make_fused_optimizer(spec, fresh_net->parameters());
  auto fresh_reference = libtorch_optimizer(spec, *fresh_net);
  CHECK(saved(*fresh).size() == saved(*fresh_reference).size());
}

TEST_CASE(
    "a fused step from deterministic mode's reduced sum is bitwise the step after assembling it",
    "[unit]") {
  const auto variant =
      GENERATE(Variant{"sgd", 5e-4, 0.9, 0, true}, Variant{"sgd", 0, 0, 0, false},
               Variant{"adamw", 0.01, 0, 0, false}, Variant{"lamb", 0.01, 0, 0, false},
               Variant{"lars", 5e-4, 0.9, 0, false});
  const int threads = GENERATE(1, 2);
  CAPTURE(variant.name, variant.momentum, threads);
  const Threads use(threads);
  const auto spec = spec_of(variant);
  // Listed elements fall at the edges of the update's parallel chunks.
  const auto make = two_parameters;
  auto assembled_net = make();
  auto reduced_net = make();
  // The trainer's layout: the gradients are the first part of a flat buffer (here with
  // 5 elements past them, as the packet's table, loss and control word are).
  vflow::vnode::GradientBuffer buffer(assembled_net->parameters());
  const int64_t n = 40007;
  auto assembled = vflow::engine::make_fused_optimizer(spec, assembled_net->parameters());
  auto direct = vflow::engine::make_fused_optimizer(spec, reduced_net->parameters());
  auto& fixed = dynamic_cast<vflow::engine::FixedPointStep&>(*direct);
  for (int k = 0; k < 6; ++k) {
    torch::manual_seed(100 + k);
    // Sums of up to 2^30 units, beyond float's 24 bits, so that the conversion rounds.
    const auto dense = torch::randint(-(int64_t{1} << 30), int64_t{1} << 30, {n + 5},
                                      torch::TensorOptions(torch::kInt32));
    const auto index =
        torch::tensor(std::vector<int64_t>{0, 16383, 16384, 16385, 32768, 39999, n - 1, n + 2});
    const auto value = torch::tensor(std::vector<int64_t>{int64_t{1} << 40, -(int64_t{3} << 38), 7,
                                                          int64_t{1} << 33, -(int64_t{5} << 36),
                                                          int64_t{1} << 41, 12345, 99});
    auto whole = torch::zeros({n + 5});
    vflow::vnode::FixedPointSum::assemble(dense, index, value, whole);
    {
      torch::NoGradGuard no_grad;
      const auto params = assembled_net->parameters();
      params[0].mutable_grad().copy_(whole.narrow(0, 0, 40000));
      params[1].mutable_grad().copy_(whole.narrow(0, 40000, 7));
    }
    assembled->step();
    fixed.step_fixed_point(vflow::vnode::FixedPointSum::reduced(dense, index, value, n));
    // assemble from an offset writes only the rest, as the whole one does there.
    auto tail = torch::full({n + 5}, 7.0f);
    vflow::vnode::FixedPointSum::assemble(dense, index, value, tail, n);
    CHECK(torch::equal(tail.narrow(0, n, 5), whole.narrow(0, n, 5)));
    CHECK(torch::equal(tail.narrow(0, 0, n), torch::full({n}, 7.0f)));
  }
  const auto pa = assembled_net->parameters();
  const auto pr = reduced_net->parameters();
  for (size_t i = 0; i < pa.size(); ++i) CHECK(torch::equal(pa[i], pr[i]));
  CHECK(!torch::equal(pa[0], make()->parameters()[0]));
}

TEST_CASE(
    "a fused step that rounds one worker's gradients as it reads them is bitwise the step "
    "after rounding them in place",
    "[unit]") {
  const auto variant =
      GENERATE(Variant{"sgd", 5e-4, 0.9, 0, true}, Variant{"sgd", 0, 0, 0, false},
               Variant{"adamw", 0.01, 0, 0, false}, Variant{"lamb", 0.01, 0, 0, false},
               Variant{"lars", 5e-4, 0.9, 0, false});
  const int threads = GENERATE(1, 2);
  CAPTURE(variant.name, variant.momentum, threads);
  const Threads use(threads);
  const auto spec = spec_of(variant);
  const auto make = two_parameters;
  auto rounded_net = make();
  auto reading_net = make();
  // The trainer's layout: gradients first, then 5 elements (table, loss, control word).
  vflow::vnode::GradientBuffer rounded_buffer(rounded_net->parameters(), 5);
  vflow::vnode::GradientBuffer reading_buffer(reading_net->parameters(), 5);
  const int64_t n = 40007;
  auto first = vflow::engine::make_fused_optimizer(spec, rounded_net->parameters());
  auto second = vflow::engine::make_fused_optimizer(spec, reading_net->parameters());
  auto& reading = dynamic_cast<vflow::engine::FixedPointStep&>(*second);
  for (int k = 0; k < 6; ++k) {
    torch::manual_seed(100 + k);
    // Values of every magnitude in the sum's range, most with bits below 2^-36 to round
    // away, some exact ties, some above 2^-13 (where 2^36 x needs more than float's 24
    // bits), zeros, and the largest allowed.
    auto values = torch::randn({n + 5}) * torch::pow(10.0, torch::randint(-12, 3, {n + 5}));
    values[3] = 0.0f;
    values[4] = std::ldexp(5.0f, -37);  // 2.5 units: a tie, rounds to 2
    values[5] = -std::ldexp(3.0f, -37);
    values[6] = 1048575.9f;
    values[n + 1] = 0.123456789f;  // past the gradients: rounded by the pass alike
    vflow::vnode::FixedPointSum rounded_sum(n + 5, torch::kCPU);
    vflow::vnode::FixedPointSum reading_sum(n + 5, torch::kCPU);
    rounded_buffer.flat().copy_(values);
    reading_buffer.flat().copy_(values);
    const double a = rounded_sum.round_in_place(rounded_buffer.flat());
    const double b = reading_sum.round_in_place_from(reading_buffer.flat(), n);
    CHECK(a == b);
    CHECK(a < vflow::vnode::FixedPointSum::kLimit);
    // The part past the gradients is rounded alike; the gradients are left as they were.
    CHECK(
        torch::equal(reading_buffer.flat().narrow(0, n, 5), rounded_buffer.flat().narrow(0, n, 5)));
    CHECK(torch::equal(reading_buffer.flat().narrow(0, 0, n), values.narrow(0, 0, n)));
    CHECK(!torch::equal(rounded_buffer.flat().narrow(0, 0, n), values.narrow(0, 0, n)));
    first->step();
    reading.step_rounding();
  }
  const auto pa = rounded_net->parameters();
  const auto pr = reading_net->parameters();
  for (size_t i = 0; i < pa.size(); ++i) CHECK(torch::equal(pa[i], pr[i]));
  CHECK(!torch::equal(pa[0], make()->parameters()[0]));
}

TEST_CASE("rounding from an offset still finds a value out of the exact sum's range", "[unit]") {
  vflow::vnode::FixedPointSum sum(100, torch::kCPU);
  auto values = torch::full({100}, 0.5f);
  values[10] = 2e6f;  // in the part left unrounded
  CHECK(sum.round_in_place_from(values, 50) == Approx(2e6));
  values[10] = std::nanf("");
  CHECK(std::isnan(sum.round_in_place_from(values, 50)));
}

TEST_CASE(
    "sharded fused optimizers step bitwise as unsharded ones, and their state moves by shard "
    "through the unsharded checkpoint format",
    "[unit][shard]") {
  const std::string name = GENERATE("sgd", "adamw", "lamb", "lars");
  CAPTURE(name);
  const auto spec = spec_of(name, 1e-3);
  auto [plain_net, sharded_net] = twins();
  // 5 canonical shards (LAMB and LARS sum their norms by them, sharded or not).
  const auto make = [&](Net& net) {
    return vflow::engine::make_fused_optimizer(spec, net.parameters(), 5);
  };
  auto plain = make(*plain_net);
  auto sharded = make(*sharded_net);
  auto& shards = dynamic_cast<vflow::engine::ShardedState&>(*sharded);
  const int64_t numel = 37 * 64 + 64 + 64 * 10 + 10;
  shards.shard_by(vflow::vnode::ShardLayout(numel, 5));
  shards.set_kept({0, 1, 2, 3, 4});
  shards.set_owned({0, 1, 2, 3, 4});
  shards.set_exchange([](torch::Tensor&) {});  // one worker: its own figures are the sum
  for (int k = 0; k < 10; ++k) {
    set_gradients(*plain_net, k);
    set_gradients(*sharded_net, k);
    plain->step();
    sharded->step();
  }
  const auto pp = plain_net->parameters();
  const auto ps = sharded_net->parameters();
  for (size_t i = 0; i < pp.size(); ++i) CHECK(torch::equal(pp[i], ps[i]));
  // Two saved states are the same where an unsharded optimizer resumed from each takes the
  // same steps (the archives' keys name the parameters' addresses, which differ).
  const auto same_state = [&](const std::string& x, const std::string& y) {
    auto [net_x, net_y] = twins();
    auto ox = make(*net_x);
    auto oy = make(*net_y);
    load(*ox, x);
    load(*oy, y);
    for (int k = 20; k < 23; ++k) {
      set_gradients(*net_x, k);
      set_gradients(*net_y, k);
      ox->step();
      oy->step();
    }
    const auto px = net_x->parameters();
    const auto py = net_y->parameters();
    for (size_t i = 0; i < px.size(); ++i) {
      if (!torch::equal(px[i], py[i])) return false;
    }
    return true;
  };
  // Holding every shard, it saves what the unsharded one saves.
  const auto whole = saved(*plain);
  CHECK(same_state(saved(*sharded), whole));
  // An optimizer that starts fresh is not the same (the check can fail).
  CHECK_FALSE(same_state(saved(*make(*plain_net)), whole));
  // Two workers' parts of the checkpoint, put together by shard, are the whole again.
  auto [net_a, net_b] = twins();
  auto a = make(*net_a);
  auto b = make(*net_b);
  auto& sa = dynamic_cast<vflow::engine::ShardedState&>(*a);
  auto& sb = dynamic_cast<vflow::engine::ShardedState&>(*b);
  sa.shard_by(vflow::vnode::ShardLayout(numel, 5));
  sb.shard_by(vflow::vnode::ShardLayout(numel, 5));
  sa.set_kept({1, 3});
  sb.set_kept({0, 2, 4});
  load(*a, whole);
  load(*b, whole);
  CHECK(sa.held() == std::vector<int64_t>{1, 3});
  CHECK(sb.held() == std::vector<int64_t>{0, 2, 4});
  CHECK(sa.steps() == (name == "sgd" ? 1 : 10));  // LibTorch's SGD counts no steps
  // A worker that holds part of the state refuses to save it as the whole.
  CHECK_THROWS_WITH(saved(*a), Catch::Contains("before it was gathered whole"));
  for (const int64_t s : sb.held()) sa.set_shard(s, sb.shard(s));
  CHECK(same_state(saved(*a), whole));
  sa.trim();
  CHECK(sa.held() == std::vector<int64_t>{1, 3});
  CHECK(sa.held_bytes() ==
        (sa.layout().shard(1).numel() + sa.layout().shard(3).numel()) * sa.state_tensors() * 4);
  // A checkpoint's shards (here sb's and sa's own, by shard) are read only once the kept
  // ones are known, and only those.
  std::vector<int64_t> read;
  sa.set_kept({0, 4});
  sa.load_shards(sa.layout(), sa.steps(), [&](int64_t s) {
    read.push_back(s);
    return (s == 1 || s == 3 ? sa : sb).shard(s).clone();
  });
  CHECK(read.empty());
  CHECK(sa.held().empty());
  sa.read_pending();
  CHECK(read == std::vector<int64_t>{0, 4});
  CHECK(sa.held() == std::vector<int64_t>{0, 4});
  CHECK(torch::equal(sa.shard(4), sb.shard(4)));
}

namespace {

/// Two workers' sum of per-shard figures, in one process: each hands in its tensor and
/// gets the sum (rank 0's plus rank 1's) once both have.
class Rendezvous {
 public:
  void sum(int rank, torch::Tensor& mine) {
    std::unique_lock<std::mutex> lock(mutex_);
    slots_[rank] = mine.clone();
    const int64_t round = round_;
    if (++arrived_ == 2) {
      done_ = slots_[0] + slots_[1];
      arrived_ = 0;
      ++round_;
      changed_.notify_all();
    } else {
      changed_.wait(lock, [&] { return round_ != round; });
    }
    mine.copy_(done_);
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<torch::Tensor> slots_{2};
  torch::Tensor done_;
  int arrived_ = 0;
  int64_t round_ = 0;
};

}  // namespace

TEST_CASE(
    "LAMB and LARS form their trust ratios by canonical shard: two workers holding some shards "
    "each step bitwise as one holding all, on any number of threads",
    "[unit][shard]") {
  const std::string name = GENERATE("lamb", "lars");
  CAPTURE(name);
  auto spec = spec_of(name, 0.01);
  spec.exclude_bias_and_norm = false;  // every parameter's ratio spans shards
  const int64_t numel = 37 * 64 + 64 + 64 * 10 + 10;
  const vflow::vnode::ShardLayout layout(numel, 5);
  // One worker holding every shard, with 1 and with 2 threads.
  std::vector<std::shared_ptr<Net>> whole;
  for (const int threads : {1, 2}) {
    const Threads use(threads);
    auto [net, unused] = twins();
    auto o = vflow::engine::make_fused_optimizer(spec, net->parameters(), 5);
    for (int k = 0; k < 8; ++k) {
      set_gradients(*net, k);
      o->step();
    }
    whole.push_back(net);
  }
  // Two workers: shards 0..2 and 2..4 (shard 2 on both, as a second home), each updating
  // its own, then taking the other's parameters (the gather).
  auto [net_a, net_b] = twins();
  auto a = vflow::engine::make_fused_optimizer(spec, net_a->parameters(), 5);
  auto b = vflow::engine::make_fused_optimizer(spec, net_b->parameters(), 5);
  auto& sa = dynamic_cast<vflow::engine::ShardedState&>(*a);
  auto& sb = dynamic_cast<vflow::engine::ShardedState&>(*b);
  Rendezvous rendezvous;
  sa.shard_by(layout);
  sb.shard_by(layout);
  sa.set_kept({0, 1, 2});
  sb.set_kept({2, 3, 4});
  sa.set_owned({0, 1});
  sb.set_owned({2, 3, 4});
  sa.set_exchange([&](torch::Tensor& t) { rendezvous.sum(0, t); });
  sb.set_exchange([&](torch::Tensor& t) { rendezvous.sum(1, t); });
  for (int k = 0; k < 8; ++k) {
    set_gradients(*net_a, k);
    set_gradients(*net_b, k);
    std::thread other([&] { b->step(); });
    a->step();
    other.join();
    auto fa = sa.flat_parameters();
    auto fb = sb.flat_parameters();
    for (int64_t s = 0; s < 5; ++s) {
      const auto r = layout.shard(s);
      const auto& from = s <= 2 ? fa : fb;
      auto into = s <= 2 ? fb : fa;
      into.narrow(0, r.begin, r.numel()).copy_(from.narrow(0, r.begin, r.numel()));
    }
  }
  const auto p1 = whole[0]->parameters();
  const auto p2 = whole[1]->parameters();
  const auto pa = net_a->parameters();
  const auto pb = net_b->parameters();
  for (size_t i = 0; i < p1.size(); ++i) {
    CAPTURE(i);
    CHECK(torch::equal(p1[i], p2[i]));
    CHECK(torch::equal(p1[i], pa[i]));
    CHECK(torch::equal(p1[i], pb[i]));
  }
  // The ratios took effect (the parameters moved), and another cut of the same norms
  // (one canonical shard) is another sum, close but not these bits: the check can fail.
  auto [net_one, fresh] = twins();
  CHECK_FALSE(torch::equal(p1[1], fresh->parameters()[1]));  // [0] is the frozen one
  auto one = vflow::engine::make_fused_optimizer(spec, net_one->parameters(), 1);
  for (int k = 0; k < 8; ++k) {
    set_gradients(*net_one, k);
    one->step();
  }
  check_close(*net_one, *whole[0]);
}
