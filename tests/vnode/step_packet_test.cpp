// The step's collective packet: its sections, the gradient views and the control word.
#include "vflow/vnode/step_packet.h"

#include <torch/torch.h>

#include <catch2/catch.hpp>

using vflow::vnode::StepPacket;

TEST_CASE("the step packet lays out gradients, table, loss, stop and regroup in order", "[unit]") {
  torch::nn::Linear layer(3, 2);  // 6 weights + 2 biases
  StepPacket packet(layer->parameters(), /*table_numel=*/5);
  const auto& sections = packet.sections();
  REQUIRE(sections.size() == 5);
  const std::vector<std::string> names{"gradients", "table", "loss", "stop", "regroup"};
  int64_t next = 0;
  for (size_t k = 0; k < sections.size(); ++k) {
    CAPTURE(k);
    CHECK(sections[k].name == names[k]);
    CHECK(sections[k].offset == next);  // contiguous, nothing between or overlapping
    next += sections[k].numel;
  }
  CHECK(next == packet.numel());
  CHECK(sections[0].numel == 8);
  CHECK(sections[1].numel == 5);
  CHECK(&packet.section_of(StepPacket::Part::kRegroup) == &sections.back());
  CHECK(packet.table().numel() == 5);
  // Every .grad is a view into the gradients section: a backward pass writes the packet.
  const auto x = torch::ones({4, 3});
  layer->forward(x).sum().backward();
  CHECK(packet.gradients().abs().sum().item<double>() > 0);
  CHECK(packet.table().abs().sum().item<double>() == 0);
  packet.gradient_buffer().check_views();
  packet.clear();
  CHECK(packet.flat().abs().sum().item<double>() == 0);
  CHECK(layer->weight.grad().abs().sum().item<double>() == 0);
}

TEST_CASE("the step packet's control word and loss survive the sum of the workers' packets",
          "[unit]") {
  torch::nn::Linear a_layer(2, 2), b_layer(2, 2);
  StepPacket a(a_layer->parameters(), 3), b(b_layer->parameters(), 3);
  CHECK_FALSE(a.tail().stop);
  CHECK(a.tail().regroup == 0);
  a.add_loss(torch::tensor(0.5), 4);  // worker a: one vnode of 4 examples, mean loss 0.5
  b.add_loss(torch::tensor(0.25), 4);
  b.add_loss(torch::tensor(1.0), 2);
  b.request_stop();      // any worker may ask to stop
  a.request_regroup(7);  // one worker (rank 0) relays the next generation
  a.flat() += b.flat();  // what the sum-allreduce does
  CHECK(a.tail().stop);
  CHECK(a.tail().regroup == 7);
  CHECK(a.tail().loss_sum == Approx(0.5 * 4 + 0.25 * 4 + 1.0 * 2));
  a.clear();
  CHECK_FALSE(a.tail().stop);
  CHECK(a.tail().regroup == 0);
  CHECK(a.tail().loss_sum == 0);
}

TEST_CASE("the verify section carries two 64-bit hashes through the sum and is not hashed itself",
          "[unit]") {
  torch::nn::Linear a_layer(3, 2), b_layer(3, 2);
  StepPacket plain(a_layer->parameters(), 2);
  CHECK_FALSE(plain.has_verify());
  StepPacket a(a_layer->parameters(), 2, /*verify=*/true), b(b_layer->parameters(), 2, true);
  REQUIRE(a.has_verify());
  CHECK(a.sections().back().name == "verify");
  CHECK(a.numel() == plain.numel() + 8);
  // One vnode's contribution: a backward pass, a loss, a table row.
  a_layer->forward(torch::ones({4, 3})).sum().backward();
  a.add_loss(torch::tensor(0.75), 4);
  a.table().fill_(0.5);
  const uint64_t before = a.contribution_hash();
  // The control word and the verify section are not part of the contribution.
  a.request_stop();
  a.request_regroup(3);
  a.write_hash(StepPacket::Role::kOwner, 0xfedcba9876543210ULL);
  CHECK(a.contribution_hash() == before);
  b.write_hash(StepPacket::Role::kChecker, 0x0123456789abcdefULL);
  a.flat() += b.flat();  // each place written by one worker: the sum is both
  CHECK(a.tail().hashes[0] == 0xfedcba9876543210ULL);
  CHECK(a.tail().hashes[1] == 0x0123456789abcdefULL);
  CHECK(a.tail().regroup == 3);
  CHECK(plain.tail().hashes[0] == 0);
}
