// A hash of text that is the same in every build and on every host (FNV-1a, 64 bits): for
// names and digests that are stored or compared between processes.
#pragma once

#include <cstdint>
#include <string_view>

namespace vflow {

inline uint64_t fnv1a(std::string_view text) {
  uint64_t hash = 14695981039346656037ULL;
  for (const unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
  return hash;
}

}  // namespace vflow
