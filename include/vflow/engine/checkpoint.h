// Checkpoint files: helpers around the trainer's save/load.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace vflow::engine {

/// "<dir>/step-00001234.pt".
std::string checkpoint_path(const std::string& dir, int64_t step);
/// Checkpoints in `dir`, oldest first (by step). Empty if the directory does not exist.
std::vector<std::string> list_checkpoints(const std::string& dir);
/// The newest checkpoint in `dir`; throws CheckpointError if there is none.
std::string latest_checkpoint(const std::string& dir);
/// Deletes all but the newest `keep` checkpoints in `dir`.
void prune_checkpoints(const std::string& dir, int64_t keep);
/// Writes `write(tmp_path)` to a temporary file, fsyncs it, renames it over `path`
/// and fsyncs the directory: readers see the old file or the complete new one.
void write_atomically(const std::string& path,
                      const std::function<void(const std::string&)>& write);

}  // namespace vflow::engine
