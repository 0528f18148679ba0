// The records of the control plane as text: every value the coordinator, the workers
// and vflow-ctl write to or read from the job's store is encoded and decoded here. A
// value that does not decode (a damaged store, another program's keys) is a vflow::Error
// naming the key, never a crash.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "vflow/job/control_plane.h"

namespace vflow::job::records {

/// A decimal integer, all of the text; anything else is an Error naming `key`.
int64_t decode_int(const std::string& text, const std::string& key);

/// "<virtual_nodes> <min_workers> <max_workers>".
std::string encode_limits(const JobLimits& limits);
JobLimits decode_limits(const std::string& text, const std::string& key);

/// "<donor>|<transfer 0/1>|<stop 0/1>|<members,...>|<vnodes,...>".
std::string encode_generation(const Generation& generation);
Generation decode_generation(int64_t id, const std::string& text, const std::string& key);

/// "shrink <parent>", "grow <parent> <members>", "join" or "none".
std::string encode_offer(const RegroupOffer& offer);

/// The rule of ControlPlane::agree_regroup over every member's offer text, in rank
/// order: "shrink", "grow <members of the earlier generation>" or "fresh".
std::string regroup_answer(const std::vector<std::string>& offers);

/// What a settled regroup answer ("shrink", "grow <n>", "fresh") means.
RegroupAnswer decode_regroup_answer(const std::string& text, const std::string& key);

/// "<timeout ms> <replace_failed 0/1> 0 <device>" (the third field is unused; the spec,
/// version and directory have keys of their own).
std::string encode_job_record(const JobRecord& record);
JobRecord decode_job_record(const std::string& text, const std::string& key);

/// One line "<seconds> <device type>" per type (a type's name may hold spaces).
std::string encode_profiled(const std::map<std::string, double>& seconds_per_vnode);
std::map<std::string, double> decode_profiled(const std::string& text, const std::string& key);

/// "<agent> <slot>" (ControlPlane::place writes it).
Placement decode_placement(const std::string& text, const std::string& key);

/// "<code>" or "<code> <why>".
std::string encode_exit(const WorkerExit& exit);
WorkerExit decode_exit(const std::string& text, const std::string& key);

}  // namespace vflow::job::records
