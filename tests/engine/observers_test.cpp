// The example log's hand-over: a worker that completed a step rank 0 did not logs it when
// it gives its state to the next generation.
#include "vflow/engine/observers.h"

#include <catch2/catch.hpp>
#include <thread>

#include "support.h"
#include "vflow/comm/communicator.h"
#include "vflow/engine/run_job.h"
#include "vflow/job/launcher.h"

TEST_CASE("a state donor logs the step it completed that rank 0 did not", "[integration]") {
  using namespace vflow;
  testing::TempDir dir;
  const std::string path = dir.file("examples.log");
  // Two real workers of a 2-rank job, so that one of them is not rank 0.
  job::StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(10));
  std::shared_ptr<comm::Communicator> comms[2];
  std::thread other([&] {
    comms[1] = comm::make_gloo_communicator(testing::rendezvous_at(coordinator, 1, 2, "t", 10000));
  });
  comms[0] = comm::make_gloo_communicator(testing::rendezvous_at(coordinator, 0, 2, "t", 10000));
  other.join();
  const auto spec = testing::small_job();
  const auto leader = engine::make_trainer(spec);
  const auto donor = engine::make_trainer(spec);
  leader->set_communicator(comms[0]);
  donor->set_communicator(comms[1]);
  REQUIRE(donor->rank() == 1);

  engine::ExampleLogObserver at_leader(path), at_donor(path);
  engine::StepInfo info;
  info.examples_used = {{0, {5, 1}}, {1, {7, 3}}};
  for (int64_t step = 0; step < 3; ++step) {
    info.step = step;
    at_leader.on_step_end(*leader, info);
    at_donor.on_step_end(*donor, info);  // not rank 0: keeps the lines, writes nothing
  }
  CHECK(testing::read_file(path) == "0 0 5 1\n0 1 7 3\n1 0 5 1\n1 1 7 3\n2 0 5 1\n2 1 7 3\n");
  // The donor completed step 3; rank 0's allreduce of step 3 failed.
  info.step = 3;
  at_donor.on_step_end(*donor, info);
  at_donor.on_state_donated(*donor);
  const std::string four_steps = testing::read_file(path);
  CHECK(four_steps.substr(four_steps.size() - 16) == "3 0 5 1\n3 1 7 3\n");
  // Handing over again (another resize) adds nothing: the file already ends at step 3.
  at_donor.on_state_donated(*donor);
  CHECK(testing::read_file(path) == four_steps);
  // A donor whose last step rank 0 logged adds nothing either.
  info.step = 4;
  at_leader.on_step_end(*leader, info);
  at_donor.on_step_end(*donor, info);
  at_donor.on_state_donated(*donor);
  CHECK(testing::read_file(path) == four_steps + "4 0 5 1\n4 1 7 3\n");
  // Lines longer than the tail is read at a time (large vnodes), across its chunks.
  for (int64_t step = 5; step < 7; ++step) {
    info.step = step;
    info.examples_used = {{0, {7}}, {1, std::vector<int64_t>(1500 + step, 123456)}};
    at_donor.on_step_end(*donor, info);
    if (step == 5) at_leader.on_step_end(*leader, info);
  }
  at_donor.on_state_donated(*donor);
  const std::string log = testing::read_file(path);
  CHECK(log.find("\n5 1 123456") != std::string::npos);
  CHECK(log.find("\n6 0 7\n6 1 123456") != std::string::npos);
  CHECK(log.size() - log.find("\n6 1 ") == 5 + 1506 * 7);  // the whole line, once
  at_donor.on_state_donated(*donor);
  CHECK(testing::read_file(path) == log);
}
