// The members of a new generation agree through the job's store how they regroup: derive
// a communicator from an earlier one (shrink, grow) only when all can, else afresh.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "vflow/comm/communicator.h"
#include "vflow/job/control_plane.h"
#include "vflow/job/launcher.h"

using vflow::job::StoreHost;

TEST_CASE("members derive a communicator from an earlier one only when all can", "[integration]") {
  using vflow::job::Regroup;
  using vflow::job::RegroupOffer;
  using Kind = RegroupOffer::Kind;
  StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(10));
  const RegroupOffer none;
  const RegroupOffer join{Kind::kJoin, 0};
  auto shrink = [](int64_t parent) { return RegroupOffer{Kind::kShrink, parent}; };
  auto grow = [](int64_t parent, int64_t members) {
    return RegroupOffer{Kind::kGrow, parent, members};
  };
  // Each member offers what it can, from a thread of its own over its own connection,
  // as the workers do; every member must get the same answer.
  auto agree = [&](int64_t generation, const std::vector<RegroupOffer>& offers) {
    std::vector<std::string> members;
    for (size_t m = 0; m < offers.size(); ++m) members.push_back(fmt::format("w{}", m));
    std::vector<vflow::job::RegroupAnswer> answers(members.size());
    std::vector<std::string> errors(members.size());
    std::vector<std::thread> threads;
    for (size_t m = 0; m < members.size(); ++m) {
      threads.emplace_back([&, m] {
        try {
          vflow::job::ControlPlane control(coordinator.host(), coordinator.port(),
                                           std::chrono::seconds(5));
          answers[m] = control.agree_regroup(generation, members, members[m], offers[m],
                                             std::chrono::seconds(5));
        } catch (const std::exception& e) {
          errors[m] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (const auto& e : errors) REQUIRE(e.empty());
    for (const auto& a : answers) {
      REQUIRE(a.how == answers.front().how);
      REQUIRE(a.grown_from == answers.front().grown_from);
    }
    return answers.front();
  };
  auto how = [&](int64_t generation, const std::vector<RegroupOffer>& offers) {
    return agree(generation, offers).how;
  };
  CHECK(how(3, {shrink(2), shrink(2), shrink(2)}) == Regroup::kShrink);
  // One member lost its communicator (it failed meanwhile): nobody shrinks.
  CHECK(how(5, {shrink(4), none, shrink(4)}) == Regroup::kFresh);
  // Communicators of different generations cannot be shrunk together.
  CHECK(how(6, {shrink(5), shrink(5), shrink(4)}) == Regroup::kFresh);
  // Exactly the earlier members first, then the new ones, who can all join: a grow; the
  // new ranks learn where theirs start.
  const auto grown = agree(7, {grow(6, 2), grow(6, 2), join});
  CHECK(grown.how == Regroup::kGrow);
  CHECK(grown.grown_from == 2);
  CHECK(agree(8, {grow(7, 1), join, join}).grown_from == 1);
  // A new member that cannot join, one in the middle, an earlier member without its
  // communicator, an earlier generation of another size, a grow that adds nobody,
  // nothing but new members: afresh.
  CHECK(how(9, {grow(8, 2), grow(8, 2), none}) == Regroup::kFresh);
  CHECK(how(10, {grow(9, 2), join, grow(9, 2)}) == Regroup::kFresh);
  CHECK(how(11, {grow(10, 2), none, join}) == Regroup::kFresh);
  CHECK(how(12, {grow(11, 2), join, join}) == Regroup::kFresh);
  CHECK(how(13, {grow(12, 2), grow(12, 2)}) == Regroup::kFresh);
  CHECK(how(14, {join, join}) == Regroup::kFresh);
  CHECK(how(15, {shrink(14), join}) == Regroup::kFresh);
  CHECK(how(16, {none}) == Regroup::kFresh);

  // A member that says nothing is a PeerFailure within the timeout, naming it.
  const std::vector<std::string> members = {"w0", "w1", "w2"};
  vflow::job::ControlPlane control(coordinator.host(), coordinator.port(), std::chrono::seconds(5));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(
      control.agree_regroup(17, members, "w0", shrink(16), std::chrono::milliseconds(300)),
      vflow::comm::PeerFailure);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
  CHECK_THROWS_WITH(
      control.agree_regroup(18, members, "w0", grow(17, 3), std::chrono::milliseconds(100)),
      Catch::Contains("member w1 did not say"));
  // A member that comes after another gave up on it finds every offer, but follows the
  // settled answer: nobody regroups without a member another one has given up on.
  const std::vector<std::string> pair = {"w0", "w1"};
  CHECK_THROWS_AS(control.agree_regroup(19, pair, "w0", shrink(18), std::chrono::milliseconds(100)),
                  vflow::comm::PeerFailure);
  CHECK_THROWS_WITH(control.agree_regroup(19, pair, "w1", shrink(18), std::chrono::seconds(5)),
                    Catch::Contains("member w1 did not say"));
}
