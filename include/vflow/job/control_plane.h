// Generations and the control plane of an elastic job (docs/design.md §4): the typed
// client of the job's store.
//
// Everything elastic goes through the job's store, which the coordinator hosts:
// resize, leave and stop requests; workers announcing that they are ready; the
// generations the coordinator publishes; survivors reporting after a failed
// collective. See docs/elasticity.md for the protocol.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "vflow/core/error.h"
#include "vflow/job/control_store.h"

namespace vflow::job {

/// One membership of the job: who the workers are and in which rank order (a worker's
/// vnodes follow from its rank, vnode::vnodes_of).
struct Generation {
  int64_t id = 0;                    ///< 1, 2, ...; each gets a fresh store prefix
  std::vector<std::string> members;  ///< member names in rank order
  std::string donor;                 ///< the member whose training state everyone takes
  bool transfer_state = false;       ///< a member joined or a step was interrupted
  bool stop = false;                 ///< too few workers remain: stop with a checkpoint
  std::vector<int64_t> vnodes;       ///< vnodes per rank (a planned split); empty = even
  /// Rank of `member`, or -1 when it is not a member.
  int rank_of(const std::string& member) const;
  std::string describe() const;
};

/// How the members of a generation make its communicator (ControlPlane::agree_regroup).
enum class Regroup {
  kFresh,   ///< a fresh rendezvous
  kShrink,  ///< every member shrinks the communicator of the same earlier generation
  kGrow,    ///< that generation's members grow theirs, the new members join it
};

/// What one member offers towards the next generation's communicator.
struct RegroupOffer {
  enum class Kind {
    kNone,    ///< nothing: it holds no communicator it could derive the next one from
    kShrink,  ///< it holds `parent`'s communicator and the next generation drops ranks of it
    kGrow,    ///< it holds `parent`'s communicator and the next generation appends ranks
    kJoin,    ///< it is new and can join a grown communicator
  };
  Kind kind = Kind::kNone;
  int64_t parent = 0;   ///< kShrink, kGrow: the generation whose communicator it holds
  int64_t members = 0;  ///< kGrow: that generation's size (its members come first)
};

/// What the members of a generation agreed (ControlPlane::agree_regroup).
struct RegroupAnswer {
  Regroup how = Regroup::kFresh;
  int64_t grown_from = 0;  ///< kGrow: the earlier generation's size; new ranks start there
};

/// Bounds every generation respects.
struct JobLimits {
  int64_t virtual_nodes = 1;
  int64_t min_workers = 1;
  int64_t max_workers = 1;
};

/// What a job on a cluster store publishes for the processes that start, check or take
/// over coordinating its workers on other hosts (node agents, a coordinator elected after
/// the first one died).
struct JobRecord {
  std::string spec;            ///< the whole job spec (engine::JobSpec::yaml())
  std::string version;         ///< the submitting build's identity (job::build_identity())
  std::string directory;       ///< the submitter's working directory (the spec's relative paths)
  std::string device = "cpu";  ///< resources.device: "cpu", or "cuda" (any GPU slot)
  std::chrono::milliseconds timeout{30000};  ///< resources.timeout_s
  bool replace_failed = false;               ///< resources.replace_failed
};

/// The etcd user a job's submitter holds, confined to the job's keys, which node agents hand
/// to the workers they start for it (docs/security.md).
struct JobCredentials {
  std::string user;
  std::string password;
};

/// Where a worker runs: a slot of a node agent (ControlPlane::place).
struct Placement {
  std::string agent;
  int64_t slot = 0;
};

/// WorkerExit::code of a placement its agent could not take up now (another job took the
/// slot a moment before, or the agent is stopping): not a failure of the worker, which the
/// coordinator places again elsewhere.
constexpr int kPlacementDeclined = -1;

/// What a member measured of its steps, smoothed: compute per vnode it holds, and the update
/// (the optimizer on the whole model) whatever it holds.
struct MeasuredSpeed {
  double seconds_per_vnode = 0;
  double update_seconds = 0;
};

/// How a worker process ended, as the process that watched it reports it.
struct WorkerExit {
  int code = 0;
  std::string why;  ///< a refusal's reason (a node agent of another build, say); may be empty
};

/// Where a job is: running until rank 0 marks it completed or stopped, or its
/// coordinator marks it failed.
enum class JobState { kRunning, kCompleted, kStopped, kFailed };
/// "running", "completed", "stopped", "failed": as the store holds it and vflow-ctl shows it.
std::string to_string(JobState state);

/// What `vflow-ctl status` shows.
struct JobStatus {
  JobLimits limits;
  Generation generation;  ///< the latest published generation
  int64_t step = 0;       ///< steps completed, as rank 0 last published
  int64_t target = 0;     ///< the requested worker count
  JobState state = JobState::kRunning;
  std::map<std::string, int64_t> pids;  ///< process id of each member
};

/// A client of a job's store, typed for the elastic protocol: every record is encoded
/// and decoded in job/control_records, and every read-modify-write is a counter or a
/// set-if-absent of the ControlStore. Store errors surface as PeerFailure naming the
/// coordinator.
class ControlPlane {
 public:
  /// Connects to the job's embedded store at host:port (connect_embedded_store).
  ControlPlane(const std::string& host, int port, std::chrono::milliseconds timeout);
  /// Speaks the protocol over `store`.
  explicit ControlPlane(std::unique_ptr<ControlStore> store);
  /// Connects to job `job` on the cluster store `control` ("etcd://H:P,...").
  static ControlPlane on_cluster(const std::string& control, const std::string& job,
                                 std::chrono::milliseconds timeout);
  ControlPlane(ControlPlane&&) noexcept;
  ~ControlPlane();
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;
  /// The store's address, for messages.
  const std::string& address() const;
  /// The store itself (its liveness and listing).
  ControlStore& store();

  // ---- requests (vflow-ctl, the library API, signals) ----
  /// Asks for `workers` workers; throws Error when outside [min_workers, max_workers].
  void request_resize(int64_t workers);
  void request_stop();
  bool stop_requested();
  /// A worker asks to leave at the next step boundary (SIGTERM).
  void request_leave(const std::string& member);
  bool leave_requested(const std::string& member);

  // ---- the coordinator's side ----
  void publish_limits(const JobLimits& limits);
  JobLimits limits();
  /// Whether the coordinator has published the limits (the job has started).
  bool has_limits();
  /// Throws RequestRefused "no job named '<name>' runs on <where>" unless an elastic job's
  /// limits are published in this store (a job on a cluster store, found by name).
  void require_job(const std::string& name, const std::string& where);
  /// The latest resize request as (sequence number, workers); sequence 0 when none.
  std::pair<int64_t, int64_t> resize_request();
  /// Publishes `generation` unless a generation with its id was decided already (by another
  /// coordinator, or by one that died before it announced it): then that one stands, is
  /// announced, and is returned. Announcing is idempotent, so a publish that failed half-way
  /// can be repeated.
  Generation publish(const Generation& generation);
  /// The generation with the id after the latest announced, if one was decided but not
  /// announced (its coordinator died in between).
  std::optional<Generation> undeclared_generation();
  void set_target(int64_t workers);
  /// The requested worker count as last set (0 before the first).
  int64_t target();
  /// The resize request the coordinator has acted on last (a successor starts there).
  void mark_resize_handled(int64_t sequence);
  int64_t resize_handled();
  /// Removes what only generation `id` needed (its rendezvous and its records), once a
  /// later generation is established: a long job's store holds a few generations' keys.
  void forget_generation(int64_t id);

  // ---- a job on a cluster store: node agents and elected coordinators ----
  void publish_record(const JobRecord& record);
  /// nullopt for a job submitted without one (its workers started by the submitter).
  std::optional<JobRecord> record();
  /// The job's own etcd user, for the workers node agents start (job/credentials: within
  /// the job's keys, so that other jobs' users cannot read it and it goes with the job).
  void publish_credentials(const JobCredentials& credentials);
  /// nullopt for a job whose submitter gave none: its workers hold their agent's.
  std::optional<JobCredentials> credentials();
  /// A new member name, never used before in this job ("0", "1", ...).
  std::string next_member();
  /// Workers started (or placed) but not yet members of a generation.
  void add_joiner(const std::string& member);
  void remove_joiner(const std::string& member);
  std::vector<std::string> joiners();
  /// Asks node agent `where.agent` to start worker `member` on its slot `where.slot`.
  void place(const std::string& member, const Placement& where);
  std::optional<Placement> placement(const std::string& member);
  /// A worker's process ended (the node agent or launcher that watched it says so).
  void report_exit(const std::string& member, const WorkerExit& exit);
  std::map<std::string, WorkerExit> exits();
  /// Marks a volunteer as taken in (GenerationManager), so that a successor knows it.
  void adopt_volunteer(const std::string& member);
  bool volunteer_adopted(const std::string& member);
  /// The job's outcome as rank 0 saw it ("fingerprint <hex>", the accuracy): what the
  /// submitter prints when its workers ran elsewhere.
  void publish_result(const std::string& text);
  std::optional<std::string> result();

  // ---- the workers' side ----
  /// 0 before the first generation.
  int64_t latest_generation();
  Generation generation(int64_t id);
  void mark_ready(const std::string& member, int64_t pid);
  /// A worker started outside the launcher (by an external launcher, or by hand) offers
  /// to join: the coordinator takes it in at a step boundary, one more worker up to
  /// max_workers.
  void volunteer(const std::string& member);
  /// The members that volunteered, sorted.
  std::vector<std::string> volunteers();
  /// The name under which `member`'s liveness is kept (ControlStore::heartbeat).
  static std::string liveness_name(const std::string& member);
  /// The job's semantic spec as the launcher published it (publish_spec); nullopt when
  /// none was.
  std::optional<std::string> spec();
  void publish_spec(const std::string& semantic_yaml);
  bool ready(const std::string& member);
  void mark_joined(int64_t generation, const std::string& member);
  bool joined(int64_t generation, const std::string& member);
  /// After a failed collective: this member is alive at `step` (steps completed), or holds
  /// none of the job's state (-1: it failed before it had joined any generation).
  void report_survivor(int64_t generation, const std::string& member, int64_t step);
  std::optional<int64_t> survivor_step(int64_t generation, const std::string& member);
  bool failure_reported(int64_t generation);
  /// How the members of `generation` make its communicator, agreed between them: each
  /// publishes what it can offer and reads the others' offers; the answer is settled once
  /// in the store, so all members get the same one. kShrink when every member holds the
  /// communicator of the same earlier generation and offers to shrink it; kGrow when the
  /// members that come first are exactly that earlier generation's members, all offering
  /// to grow its communicator, and every later one offers to join it; otherwise kFresh.
  /// Throws PeerFailure, in every
  /// member, when one has said nothing within the `timeout` of the first member to give
  /// up on it.
  RegroupAnswer agree_regroup(int64_t generation, const std::vector<std::string>& members,
                              const std::string& me, const RegroupOffer& offer,
                              std::chrono::milliseconds timeout);
  void publish_step(int64_t step);
  /// A member's measured compute time per vnode and its update's time a step (the
  /// coordinator re-plans with them).
  void publish_speed(const std::string& member, const MeasuredSpeed& speed);
  /// A worker of an earlier version published no update time: 0.
  std::optional<MeasuredSpeed> speed(const std::string& member);
  /// A member's device type name, published as it starts (before it is measured).
  void publish_device_type(const std::string& member, const std::string& type);
  std::optional<std::string> device_type(const std::string& member);
  /// The job's profiled time per vnode by device type (resources.profiles), published once
  /// by the first coordinator so that one taking over re-plans alike; empty when none.
  void publish_profiled(const std::map<std::string, double>& seconds_per_vnode);
  std::map<std::string, double> profiled();
  /// A counter that changes whenever a generation is published or a stop requested
  /// (rank 0's step watch follows it, job/step_watch.h).
  int64_t news();
  /// The news counter once it differs from `seen`, or after `wait` (then it may equal
  /// `seen`): a watch of the key on a cluster store, a read every 10 ms on the embedded one.
  int64_t await_news(int64_t seen, std::chrono::milliseconds wait);
  /// A counter that changes whenever something the coordinator acts on happens.
  int64_t requests();
  /// Marks the job finished (not kRunning).
  void mark_done(JobState state);
  /// kRunning until it is marked finished.
  JobState state();

  JobStatus status();

 private:
  std::optional<std::string> get(const std::string& key);
  void set(const std::string& key, const std::string& value);
  int64_t add(const std::string& key, int64_t delta);
  /// Stores `value` under `key` unless the key holds a value already; returns what the
  /// key holds afterwards.
  std::string compare_set(const std::string& key, const std::string& value);
  /// The last part of every key under `prefix`.
  std::vector<std::string> names_under(const std::string& prefix);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

}  // namespace vflow::job
