// The structure and CRC-32s of a zip archive (LibTorch's checkpoints and TorchScript
// modules are zip archives), checked before LibTorch's reader sees the bytes: that reader
// checks no CRC, and its TorchScript importer can crash on a damaged entry.
#pragma once

#include <string>
#include <string_view>

namespace vflow::core {

/// "" when `bytes` are a whole, undamaged zip archive of LibTorch's kind (ZIP64 included):
/// every entry inside the file, one after another, named alike in its local header and
/// the directory, stored or deflated, matching its CRC-32, and a data.pkl among them.
/// Otherwise what is wrong, e.g. "entry archive/data.pkl fails its CRC-32 check (the
/// file is damaged)".
std::string zip_archive_problem(std::string_view bytes);

}  // namespace vflow::core
