#include "engine/verification.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>

#include "vflow/comm/communicator.h"
#include "vflow/comm/nccl.h"
#include "vflow/core/build_id.h"
#include "vflow/core/error.h"
#include "vflow/core/hash.h"
#include "vflow/vnode/step_packet.h"

namespace vflow::engine {

namespace {

// The signature's hash travels as a verify place's parts do.
constexpr int64_t kSignatureParts = vnode::StepPacket::kHashParts;
constexpr int64_t kNameChars = 64;  // a member's or host's name, one character a slot
// One rank's row of the exchange: signature, pid, member, host.
constexpr int64_t kRow = kSignatureParts + 1 + 2 * kNameChars;

/// The first line of /proc/cpuinfo starting with `key`, past its colon; empty if none.
std::string cpuinfo(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    const auto colon = line.find(':');
    return colon == std::string::npos ? std::string{} : line.substr(colon + 1);
  }
  return {};
}

/// The BLAS library this process has loaded (the file behind it), or "none".
std::string loaded_blas() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const auto name = path.substr(path.rfind('/') + 1);
    if (name.rfind("libblas", 0) == 0 || name.rfind("libopenblas", 0) == 0 ||
        name.rfind("libmkl", 0) == 0) {
      char resolved[4096];
      return realpath(path.c_str(), resolved) != nullptr ? std::string(resolved) : path;
    }
  }
  return "none";
}

std::string cpu_signature() {
  std::string isa;
  const std::string flags = " " + cpuinfo("flags") + " ";
  for (const char* f : {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile"}) {
    if (flags.find(fmt::format(" {} ", f)) == std::string::npos) continue;
    isa += (isa.empty() ? "" : ",") + std::string(f);
  }
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  auto model = cpuinfo("model name");
  model.erase(0, model.find_first_not_of(' '));
  return fmt::format("cpu {} ({}); {}; coretype {}", model, isa, loaded_blas(),
                     coretype != nullptr ? coretype : "auto");
}

void put_name(float* row, const std::string& name) {
  for (int64_t k = 0; k < kNameChars; ++k) {
    row[k] = k < static_cast<int64_t>(name.size()) ? static_cast<unsigned char>(name[k]) : 0;
  }
}

std::string get_name(const float* row) {
  std::string name;
  for (int64_t k = 0; k < kNameChars && row[k] != 0; ++k) name += static_cast<char>(row[k]);
  return name;
}

}  // namespace

std::string kernel_signature(c10::Device device) {
  const std::string kind =
      device.is_cuda() ? "cuda " + comm::cuda_device_name(device.index()) : cpu_signature();
  // The engine's own build (this library's GNU build id) and the LibTorch it runs on.
  const auto build = loaded_build_id(reinterpret_cast<const void*>(&kernel_signature));
  return fmt::format("vflow build {}, LibTorch {}.{}.{}; {}; {} threads",
                     build.empty() ? "unknown" : build.substr(0, 16), TORCH_VERSION_MAJOR,
                     TORCH_VERSION_MINOR, TORCH_VERSION_PATCH, kind, torch::get_num_threads());
}

void CrossChecks::meet(comm::Communicator& comm, c10::Device device) {
  const std::string signature = kernel_signature(device);
  auto mine = torch::zeros({kRow}, torch::kFloat32);
  float* row = mine.data_ptr<float>();
  mine.narrow(0, 0, kSignatureParts).copy_(vnode::StepPacket::hash_parts(fnv1a(signature)));
  row[kSignatureParts] = static_cast<float>(getpid());
  const char* member = std::getenv("VFLOW_MEMBER");
  put_name(row + kSignatureParts + 1, member != nullptr ? member : "");
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  put_name(row + kSignatureParts + 1 + kNameChars, host);
  const auto device_row = mine.to(device);
  const auto rows = comm.all_gather(device_row);
  std::vector<uint64_t> signatures;
  members_.clear();
  hosts_.clear();
  pids_.clear();
  for (const auto& r : rows) {
    const auto h = r.to(torch::kCPU).contiguous();
    const float* v = h.data_ptr<float>();
    signatures.push_back(vnode::StepPacket::hash_of_parts(h.narrow(0, 0, kSignatureParts)));
    pids_.push_back(static_cast<int64_t>(v[kSignatureParts]));
    members_.push_back(get_name(v + kSignatureParts + 1));
    hosts_.push_back(get_name(v + kSignatureParts + 1 + kNameChars));
  }
  signatures_ = std::move(signatures);
  spdlog::debug("[verify] this worker's kernel signature: {}", signature);
  if (comm.rank() != 0) return;
  const std::set<uint64_t> kinds(signatures_.begin(), signatures_.end());
  if (comm.size() < 2) return;
  if (kinds.size() == signatures_.size()) {
    spdlog::warn(
        "[verify] resources.verify_every_steps: no two of the {} workers compute with the same "
        "kernels (build, device type, instruction sets, BLAS, threads), so no vnode can be "
        "cross-checked in this generation; this worker's signature: {}",
        comm.size(), signature);
  } else if (kinds.size() > 1) {
    spdlog::info(
        "[verify] the {} workers have {} kernel signatures; vnodes are cross-checked "
        "between workers of one signature",
        comm.size(), kinds.size());
  }
}

std::optional<CrossCheck> CrossChecks::plan(int64_t step,
                                            const std::vector<vnode::VnodeRange>& held,
                                            const std::vector<int64_t>& present) const {
  VFLOW_ASSERT(held.size() == signatures_.size(), "a cross-check planned before meet()");
  if (present.empty() || held.size() < 2) return std::nullopt;
  const int64_t turn = step / every_;
  const auto owner_of = [&held](int64_t v) {
    for (size_t r = 0; r < held.size(); ++r) {
      if (v >= held[r].first && v < held[r].last) return static_cast<int>(r);
    }
    return -1;
  };
  const auto n = static_cast<int64_t>(present.size());
  for (int64_t k = 0; k < n; ++k) {  // the turn's vnode, or the next whose owner has a partner
    const int64_t v = present[static_cast<size_t>((turn + k) % n)];
    const int owner = owner_of(v);
    if (owner < 0) continue;
    std::vector<int> partners;
    for (size_t r = 0; r < held.size(); ++r) {
      if (static_cast<int>(r) != owner && signatures_[r] == signatures_[owner]) {
        partners.push_back(static_cast<int>(r));
      }
    }
    if (partners.empty()) continue;
    // The checkers take turns too, shifted once per round of the vnodes, so that every
    // pair of owner and checker comes up whatever the counts.
    const auto p = static_cast<int64_t>(partners.size());
    return CrossCheck{step, v, owner, partners[static_cast<size_t>((turn + turn / n) % p)]};
  }
  return std::nullopt;
}

int CrossChecks::referee(const CrossCheck& check) const {
  std::vector<int> thirds;
  for (size_t r = 0; r < signatures_.size(); ++r) {
    const int rank = static_cast<int>(r);
    if (rank != check.owner && rank != check.checker &&
        signatures_[r] == signatures_[static_cast<size_t>(check.owner)]) {
      thirds.push_back(rank);
    }
  }
  if (thirds.empty()) return -1;
  return thirds[static_cast<size_t>(check.step / every_) % thirds.size()];
}

std::string CrossChecks::describe(int rank) const {
  const auto r = static_cast<size_t>(rank);
  if (r >= hosts_.size()) return fmt::format("worker {}", rank);
  return fmt::format("worker {} ({}pid {} on {})", rank,
                     members_[r].empty() ? "" : "member " + members_[r] + ", ", pids_[r],
                     hosts_[r]);
}

std::optional<InjectedFault> injected_fault() {
  const char* text = std::getenv("VFLOW_INJECT_FAULT");
  if (text == nullptr || *text == 0) return std::nullopt;
  const std::string value = text;
  const auto bad = [&value](const std::string& why) {
    return SpecError(
        fmt::format("VFLOW_INJECT_FAULT='{}': {} (expected STEP:MEMBER[:BIT], "
                    "STEP:MEMBER:gather or STEP:MEMBER:late, a test switch that corrupts one "
                    "worker's gradients, kills it in a sharded job's gather or makes it late "
                    "to a sharded step's commit)",
                    value, why));
  };
  const auto first = value.find(':');
  if (first == std::string::npos) throw bad("no member");
  const auto second = value.find(':', first + 1);
  const std::string member =
      value.substr(first + 1, second == std::string::npos ? std::string::npos : second - first - 1);
  InjectedFault fault;
  try {
    size_t used = 0;
    fault.step = std::stoll(value.substr(0, first), &used);
    if (used != first || fault.step < 0) throw bad("the step is not a number of 0 or more");
    if (second != std::string::npos && value.substr(second + 1) == "gather") {
      fault.dies_in_gather = true;
    } else if (second != std::string::npos && value.substr(second + 1) == "late") {
      fault.late_to_commit = true;
    } else if (second != std::string::npos) {
      const std::string bit = value.substr(second + 1);
      fault.bit = std::stoi(bit, &used);
      if (used != bit.size() || fault.bit < 0 || fault.bit > 31) throw bad("the bit is not 0..31");
    }
  } catch (const std::logic_error&) {
    throw bad("not numbers");
  }
  const char* me = std::getenv("VFLOW_MEMBER");
  if (me == nullptr || member != me) return std::nullopt;
  if (fault.dies_in_gather) {
    spdlog::warn(
        "VFLOW_INJECT_FAULT: this worker (member {}) dies in the parameters' gather "
        "of step {}",
        member, fault.step);
  } else if (fault.late_to_commit) {
    spdlog::warn("VFLOW_INJECT_FAULT: this worker (member {}) comes late to the commit of step {}",
                 member, fault.step);
  } else {
    spdlog::warn(
        "[verify] VFLOW_INJECT_FAULT: this worker (member {}) corrupts its gradients in "
        "step {} (bit {})",
        member, fault.step, fault.bit);
  }
  return fault;
}

}  // namespace vflow::engine
