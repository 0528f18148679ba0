// Checkpoint files: helpers around the trainer's save/load.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vflow::engine {

/// "<dir>/step-00001234.pt".
std::string checkpoint_path(const std::string& dir, int64_t step);
/// Checkpoints in `dir`, oldest first (by step). Empty if the directory does not exist.
std::vector<std::string> list_checkpoints(const std::string& dir);
/// The newest checkpoint in `dir`; throws CheckpointError if there is none.
std::string latest_checkpoint(const std::string& dir);
/// Deletes all but the newest `keep` checkpoints in `dir` (each with its shards).
void prune_checkpoints(const std::string& dir, int64_t keep);

/// Where a checkpoint of sharded optimizer state keeps one file per canonical shard:
/// "<dir>/step-00001234.shards" beside "<dir>/step-00001234.pt".
std::string shard_directory(const std::string& checkpoint);
/// Shard s's file in that directory: "shard-00003.pt".
std::string shard_file(const std::string& directory, int64_t shard);

/// Checks that `bytes` are a whole, undamaged checkpoint archive before LibTorch's reader
/// sees them: a zip archive (ZIP64 included) whose every entry lies inside the file, is
/// stored or deflated, and matches its CRC-32, with the archive's data.pkl. Throws a
/// CheckpointError naming `source` and what is wrong. (LibTorch's reader checks none of the
/// CRCs, and its TorchScript importer can crash on a damaged entry.)
void check_archive(std::string_view bytes, const std::string& source);

}  // namespace vflow::engine
