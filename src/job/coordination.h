// Coordinating a job on a cluster store (docs/design.md §1): an election among candidates (the
// submitting process and every node agent) through a claim under an etcd lease, and the
// placement of workers on node agents' slots.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "job/periodic.h"
#include "vflow/job/agent.h"
#include "vflow/job/control_plane.h"
#include "vflow/job/generation_manager.h"

namespace vflow::job {

/// The time to live of leases on a cluster store (a worker's liveness, an agent's, the
/// coordinator's claim) for a job whose timeout is `timeout`: a third of it and at least
/// 3 s, so that a lost process is noticed well before survivors give up waiting for it,
/// and a fully loaded machine's late renewal is not taken for a death.
std::chrono::milliseconds lease_ttl(std::chrono::milliseconds timeout);

/// One candidate to coordinate job `job`: a thread of its own campaigns for the job's
/// coordinator claim while nobody holds it and renews it while this candidate does; the
/// caller's thread runs the generation manager (tick()) while it holds it, resumed from the
/// store when it took over from another. A candidate that cannot renew its claim within
/// the claim's time to live stops deciding by itself (a partitioned coordinator).
class CoordinatorCandidate {
 public:
  /// `source` starts joiners for this coordinator (may be null); it must outlive it.
  /// `first`: the job's submitter, which takes the claim now (throwing Error when another
  /// holds it), before the job is visible to other candidates.
  CoordinatorCandidate(const std::string& control, const std::string& job, std::string me,
                       WorkerSource* source, std::chrono::milliseconds timeout, bool first);
  ~CoordinatorCandidate();
  CoordinatorCandidate(const CoordinatorCandidate&) = delete;
  CoordinatorCandidate& operator=(const CoordinatorCandidate&) = delete;

  /// Starts the job as its first coordinator (constructed `first`): the manager's
  /// start(members, vnodes) with `options`.
  void start(const ElasticOptions& options, const std::vector<std::string>& members,
             const std::vector<int64_t>& vnodes);
  /// One round: builds or drops the manager as the claim came or went, and ticks it.
  /// Returns whether this candidate coordinates the job now.
  bool tick();
  /// The manager while this candidate coordinates, else null.
  GenerationManager* manager() { return manager_.get(); }
  ControlPlane& control() { return control_; }
  const std::string& name() const { return me_; }
  /// Stops campaigning and gives the claim up (if held): before an ended job's keys are
  /// removed, so that the claim's removal is not taken for a lost claim. Idempotent.
  void retire();

 private:
  void campaign();
  std::string control_url_;
  std::string job_;
  std::string me_;
  WorkerSource* source_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds ttl_;
  ControlPlane control_;                 // the caller's thread's client
  std::unique_ptr<ClusterStore> claim_;  // the campaign thread's client
  std::atomic<bool> leading_{false};
  std::chrono::steady_clock::time_point renewed_{};
  std::unique_ptr<GenerationManager> manager_;
  std::unique_ptr<Periodic> thread_;
};

/// Whether a slot of device `slot` ("cpu", "cuda:1") can run a worker of a job whose
/// resources.device is `job_device` ("cpu", "cuda", "cuda:0": any GPU slot).
bool device_suits(const std::string& slot, const std::string& job_device);

/// Where an agent keeps its records in the cluster's tree.
std::string agent_key(const std::string& agent);
std::string agent_slot_key(const std::string& agent, int64_t slot);
std::string agent_draining_key(const std::string& agent);
std::string agent_liveness(const std::string& agent);
std::string encode_agent(const AgentRecord& agent);

/// Places a job's workers on free slots of living node agents of the same build whose
/// device suits the job, spreading them over agents (the one with most free slots first);
/// an agent where a worker of this job could not start is not used for it again.
class AgentPlacement : public WorkerSource {
 public:
  AgentPlacement(const std::string& control, ControlPlane& job, const JobRecord& record,
                 std::chrono::milliseconds timeout);
  bool start(const std::string& member) override;
  void failed_at_start(const std::string& member, const WorkerExit& exit) override;
  /// The agents and their free slots, for messages.
  std::string describe();

 private:
  std::unique_ptr<ClusterStore> root_;
  ControlPlane& job_;
  std::string device_;
  std::string version_;
  std::set<std::string> avoided_;              // agents a worker failed to start on
  std::map<std::string, std::string> placed_;  // member -> "<agent> <slot>" not yet claimed
  std::set<std::string> mismatched_;           // agents of another build, reported once
};

}  // namespace vflow::job
