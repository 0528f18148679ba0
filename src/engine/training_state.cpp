#include "engine/training_state.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <sstream>

#include "core/input_file.h"
#include "core/output_file.h"
#include "core/torch_compat.h"
#include "vflow/core/error.h"
#include "vflow/core/spec_node.h"
#include "vflow/engine/checkpoint.h"
#include "vflow/models/registry.h"

namespace vflow::engine {

namespace {

constexpr int64_t kCheckpointFormat = 1;
/// Checkpoints are read whole into memory; this only bounds what a wrong path can cost.
constexpr uint64_t kMaxCheckpointBytes = uint64_t{1} << 40;

/// The first line where two texts differ, for a readable mismatch message.
std::string first_difference(const std::string& a, const std::string& b) {
  std::istringstream sa(a), sb(b);
  std::string la, lb;
  while (true) {
    const bool ga = static_cast<bool>(std::getline(sa, la));
    const bool gb = static_cast<bool>(std::getline(sb, lb));
    if (!ga && !gb) return "(no difference)";
    if (!ga) la = "(end)";
    if (!gb) lb = "(end)";
    if (la != lb) {
      // The checkpoint's text may be anything (a damaged file): shown short and printable.
      const auto shown = [](const std::string& line) {
        return printable(line.size() > 200 ? line.substr(0, 200) + "..." : line);
      };
      return fmt::format("checkpoint has '{}', this job has '{}'", shown(la), shown(lb));
    }
  }
}

/// Inside a catch block: LibTorch's c10::Error, or the plain std::exception its TorchScript
/// type parser throws (torch::jit::ErrorReport, on a damaged archive's class names), as a
/// CheckpointError; vflow's own errors pass unchanged.
[[noreturn]] void rethrow_as_checkpoint_error(const std::string& what) {
  try {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    throw CheckpointError(fmt::format("{}: {}", what, compat::message_of(e)));
  } catch (const std::exception& e) {
    const std::string message = e.what();
    const std::string line = message.substr(0, message.find('\n'));
    throw CheckpointError(fmt::format("{}: {}", what, line.empty() ? "a damaged archive" : line));
  }
}

/// Reads a required value of a vflow state archive.
c10::IValue read_value(torch::serialize::InputArchive& archive, const std::string& source,
                       const char* key) {
  c10::IValue v;
  if (!archive.try_read(key, v)) {
    throw CheckpointError(fmt::format("{}: not a vflow checkpoint (no '{}')", source, key));
  }
  return v;
}

void write_state(torch::serialize::OutputArchive& archive, const StateParts& parts,
                 const StateHeader& header) {
  archive.write("vflow_format", c10::IValue(kCheckpointFormat));
  archive.write("vflow_step", c10::IValue(header.step));
  archive.write("vflow_semantic", c10::IValue(header.semantic));
  archive.write("vflow_fingerprint", c10::IValue(header.fingerprint));
  torch::serialize::OutputArchive model_archive;
  parts.model.save(model_archive);
  archive.write("model", model_archive);
  if (parts.with_optimizer && parts.optimizer_shards > 0) {
    torch::serialize::OutputArchive shards_archive;
    shards_archive.write("shards", c10::IValue(parts.optimizer_shards));
    shards_archive.write("steps", c10::IValue(parts.optimizer_steps));
    archive.write("optimizer_shards", shards_archive);
  } else if (parts.with_optimizer) {
    torch::serialize::OutputArchive optimizer_archive;
    parts.optimizer.save(optimizer_archive);
    archive.write("optimizer", optimizer_archive);
  }
  if (!parts.ema.empty()) {
    torch::serialize::OutputArchive ema_archive;
    for (size_t i = 0; i < parts.ema.size(); ++i) {
      ema_archive.write(fmt::format("p{}", i), parts.ema[i], /*is_buffer=*/true);
    }
    archive.write("ema", ema_archive);
    if (header.ema_pending) archive.write("vflow_ema_pending", c10::IValue(true));
  }
}

StateHeader read_state(torch::serialize::InputArchive& archive, const std::string& path,
                       const StateParts& parts, const std::string& semantic_now,
                       int64_t total_steps, c10::Device device) {
  auto read = [&](const char* key) { return read_value(archive, path, key); };
  const int64_t format = read("vflow_format").toInt();
  if (format != kCheckpointFormat) {
    throw CheckpointError(fmt::format("{}: checkpoint format {} is not supported (expected {})",
                                      path, format, kCheckpointFormat));
  }
  StateHeader header;
  header.semantic = read("vflow_semantic").toStringRef();
  if (header.semantic != semantic_now) {
    throw CheckpointError(fmt::format(
        "{}: written by a job with a different semantic part, so resuming would change the "
        "result: {}",
        path, first_difference(header.semantic, semantic_now)));
  }
  header.step = read("vflow_step").toInt();
  header.fingerprint = read("vflow_fingerprint").toStringRef();
  c10::IValue pending;
  header.ema_pending = archive.try_read("vflow_ema_pending", pending) && pending.toBool();
  if (header.step < 0 || header.step > total_steps) {
    throw CheckpointError(
        fmt::format("{}: step {} is outside this job's {} steps", path, header.step, total_steps));
  }
  try {
    torch::serialize::InputArchive model_archive;
    archive.read("model", model_archive);
    parts.model.load(model_archive);
    if (parts.with_optimizer) {
      torch::serialize::InputArchive optimizer_archive;
      if (archive.try_read("optimizer", optimizer_archive)) {
        parts.optimizer.load(optimizer_archive);
      } else {
        // Kept by canonical shard in files of their own: the caller reads them.
        torch::serialize::InputArchive shards_archive;
        if (!archive.try_read("optimizer_shards", shards_archive)) {
          throw CheckpointError("it holds no optimizer state");
        }
        header.optimizer_shards = read_value(shards_archive, path, "shards").toInt();
        header.optimizer_steps = read_value(shards_archive, path, "steps").toInt();
      }
    }
    if (!parts.ema.empty()) {
      torch::serialize::InputArchive ema_archive;
      archive.read("ema", ema_archive);
      for (size_t i = 0; i < parts.ema.size(); ++i) {
        torch::Tensor t;
        ema_archive.read(fmt::format("p{}", i), t, /*is_buffer=*/true);
        if (!t.sizes().equals(parts.ema[i].sizes())) {
          throw CheckpointError(fmt::format("its weight average p{} has shape {}, the parameter {}",
                                            i, fmt::join(t.sizes(), "x"),
                                            fmt::join(parts.ema[i].sizes(), "x")));
        }
        parts.ema[i] = t.to(device);
      }
    }
  } catch (const c10::Error& e) {
    throw CheckpointError(
        fmt::format("{}: does not fit this model: {}", path, compat::message_of(e)));
  } catch (const std::exception& e) {
    throw CheckpointError(fmt::format("{}: does not fit this model: {}", path, e.what()));
  }
  return header;
}

}  // namespace

std::string serialize_state(const StateParts& parts, const StateHeader& header) {
  torch::serialize::OutputArchive archive;
  write_state(archive, parts, header);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void save_state(const std::string& path, const StateParts& parts, const StateHeader& header) {
  // LibTorch's own file writer throws from its destructor when the disk fills, which ends
  // the process in std::terminate. It writes through vflow's checked writer instead, which
  // never fails mid-way: it keeps the first error and reports it at the end.
  core::AtomicFile file(path);
  try {
    torch::serialize::OutputArchive archive;
    write_state(archive, parts, header);
    archive.save_to([&](const void* data, size_t size) { return file.write(data, size); });
  } catch (...) {
    rethrow_as_checkpoint_error(path + ": cannot write checkpoint");
  }
  if (const std::string error = file.commit(); !error.empty()) {
    throw CheckpointError(fmt::format("{}: cannot write checkpoint: {}", path, error));
  }
}

void save_shard(const std::string& path, const ShardRecord& r, const at::Tensor& state) {
  core::AtomicFile file(path);
  try {
    torch::serialize::OutputArchive archive;
    archive.write("vflow_shard_format", c10::IValue(kCheckpointFormat));
    archive.write("shard", c10::IValue(r.shard));
    archive.write("shards", c10::IValue(r.shards));
    archive.write("begin", c10::IValue(r.begin));
    archive.write("end", c10::IValue(r.end));
    archive.write("step", c10::IValue(r.step));
    archive.write("optimizer_steps", c10::IValue(r.optimizer_steps));
    archive.write("optimizer", c10::IValue(r.optimizer));
    archive.write("state", state.to(torch::kCPU), /*is_buffer=*/true);
    archive.save_to([&](const void* data, size_t size) { return file.write(data, size); });
  } catch (...) {
    rethrow_as_checkpoint_error(path + ": cannot write the optimizer state's shard");
  }
  if (const std::string error = file.commit(); !error.empty()) {
    throw CheckpointError(
        fmt::format("{}: cannot write the optimizer state's shard: {}", path, error));
  }
}

at::Tensor load_shard(const std::string& path, const ShardRecord& expected, int64_t rows) {
  const std::string bytes = read_checkpoint_file(path);
  torch::serialize::InputArchive archive;
  torch::Tensor state;
  ShardRecord r;
  try {
    archive.load_from(bytes.data(), bytes.size(), torch::kCPU);
    auto read = [&](const char* key) { return read_value(archive, path, key); };
    if (read("vflow_shard_format").toInt() != kCheckpointFormat) {
      throw CheckpointError(fmt::format("{}: shard format {} is not supported", path,
                                        read("vflow_shard_format").toInt()));
    }
    r = {read("shard").toInt(),          read("shards").toInt(),
         read("begin").toInt(),          read("end").toInt(),
         read("step").toInt(),           read("optimizer_steps").toInt(),
         read("optimizer").toStringRef()};
    if (!archive.try_read("state", state, /*is_buffer=*/true)) {
      throw CheckpointError(fmt::format("{}: a shard without its state", path));
    }
  } catch (...) {
    rethrow_as_checkpoint_error(path + ": cannot read the optimizer state's shard");
  }
  const auto describe = [](const ShardRecord& s) {
    return fmt::format("shard {} of {} (elements {}..{}) of {} at step {} (optimizer step {})",
                       s.shard, s.shards, s.begin, s.end, printable(s.optimizer), s.step,
                       s.optimizer_steps);
  };
  if (r.shard != expected.shard || r.shards != expected.shards || r.begin != expected.begin ||
      r.end != expected.end || r.step != expected.step ||
      r.optimizer_steps != expected.optimizer_steps || r.optimizer != expected.optimizer) {
    throw CheckpointError(fmt::format("{}: holds {}, where the checkpoint needs {}", path,
                                      describe(r), describe(expected)));
  }
  if (state.dim() != 2 || state.size(0) != rows || state.size(1) != r.end - r.begin ||
      state.scalar_type() != torch::kFloat32) {
    throw CheckpointError(fmt::format("{}: its state is {} {}, not {} x {} float", path,
                                      c10::toString(state.scalar_type()),
                                      fmt::join(state.sizes(), "x"), rows, r.end - r.begin));
  }
  return state;
}

std::string read_checkpoint_file(const std::string& path) {
  // Read with vflow's own checks first: LibTorch's reader would block on a FIFO and read
  // a device such as /dev/zero for ever.
  auto in = core::read_input_file(path, kMaxCheckpointBytes);
  if (!in.ok()) {
    throw CheckpointError(fmt::format("{}: cannot read checkpoint: {}", path, in.error));
  }
  // A damaged file is refused here: LibTorch checks no CRC and can crash on one.
  check_archive(in.bytes, path);
  return std::move(in.bytes);
}

StateHeader restore_state(const std::string& bytes, const std::string& source,
                          const StateParts& parts, const std::string& semantic, int64_t total_steps,
                          c10::Device device) {
  torch::serialize::InputArchive archive;
  try {
    // Onto this worker's device: the writer's may be another (a job can mix devices).
    archive.load_from(bytes.data(), bytes.size(), device);
  } catch (...) {
    rethrow_as_checkpoint_error(source + ": cannot read checkpoint");
  }
  try {
    return read_state(archive, source, parts, semantic, total_steps, device);
  } catch (...) {
    // A value of the wrong type (a damaged or foreign file).
    rethrow_as_checkpoint_error(source + ": not a usable vflow checkpoint");
  }
}

}  // namespace vflow::engine
