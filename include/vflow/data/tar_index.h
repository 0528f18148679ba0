// Tar shards in the WebDataset layout: an index of the members' offsets, read from their
// headers alone, and the examples they form (KEY.jpg or KEY.png beside KEY.cls). No LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace vflow::data {

/// A tar's block: its headers and its members' data start on multiples of it.
inline constexpr uint64_t kTarBlock = 512;

/// A regular file inside a tar: its name and where its bytes are.
struct TarMember {
  std::string name;
  uint64_t offset = 0;  ///< of the member's data, from the start of the tar
  uint64_t size = 0;
  uint64_t header = 0;  ///< offset of its header (offset - kTarBlock), for messages
};

/// Reads `n` bytes at `offset` of the tar into `out`; returns how many it read (fewer only
/// at the end of the file). Lets the index read a file (pread) or memory (tests, fuzzing).
using ReadAt = std::function<size_t(uint64_t offset, size_t n, uint8_t* out)>;

/// The regular files of a `size`-byte tar (POSIX ustar, with GNU long names and pax `path`
/// records), in the order stored. Reads only the headers (and long names). A damaged header
/// (its checksum), a truncated tar (a header or a member's data past the end) and a size
/// field that is not a number are DataErrors naming `name` and the offset.
std::vector<TarMember> index_tar(const ReadAt& read, uint64_t size, const std::string& name);

/// One example of a WebDataset shard: its image member and its class.
struct ShardExample {
  std::string key;
  TarMember image;
  int64_t label = 0;
};

/// The examples of a shard's members, in the order their keys first appear. A member's key
/// is its path up to the first dot of its file name, its extension the rest; `jpg`, `jpeg`
/// and `png` are the image, `cls` the class (a decimal integer, read through `read`). Other
/// extensions are ignored. A key without an image or a class, a class that is not a number
/// in [0, classes), and a shard without examples are DataErrors naming `name`.
std::vector<ShardExample> webdataset_examples(const std::vector<TarMember>& members,
                                              const ReadAt& read, int64_t classes,
                                              const std::string& name);

}  // namespace vflow::data
