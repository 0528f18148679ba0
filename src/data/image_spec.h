// The image data sets' job-spec options: image-folder and image-shards, and the transforms.
#pragma once

#include <string>
#include <vector>

#include "vflow/core/spec_node.h"
#include "vflow/data/dataset.h"
#include "vflow/data/image_transforms.h"

namespace vflow::data {

/// Adds "image-folder" and "image-shards" to `registry`.
void register_image_sets(DataRegistry& registry);

/// The files `patterns` (paths and globs, the key `key` of `opt`) name, in order; a pattern
/// that matches nothing is a SpecError at the key. Shared with token-shards.
std::vector<std::string> shard_files(OptionReader& opt, const char* key,
                                     const std::vector<std::string>& patterns);

/// The transforms written at `list` (a sequence of `name` or `name: options`); a mistake
/// is a SpecError naming where.
std::vector<Transform> read_transforms(const SpecNode& list);

}  // namespace vflow::data
