// Image data sets streamed from disk: a folder of class folders (ImageNet's layout) and tar
// shards in the WebDataset layout. Only an index is held in memory; each example's file is
// read, decoded and transformed when it is asked for, on the data threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "vflow/data/dataset.h"
#include "vflow/data/image_transforms.h"

namespace vflow::data {

/// `root/<class>/<file>.{jpg,jpeg,png}`: classes are the sub-folders sorted by name (as
/// torchvision's ImageFolder sorts them), files sorted by name within each. The index (the
/// files' names) is built once, with a progress line on a large folder, and cached in
/// `cache_dir` (empty: not cached); a cached index is used while every class folder's
/// modification time is what it was, else rebuilt. A class folder without images is a
/// DataError naming it; so is a file that cannot be read or decoded (CorruptExample).
std::shared_ptr<Dataset> open_image_folder(const std::string& root,
                                           std::shared_ptr<const ImagePipeline> pipeline,
                                           const std::string& cache_dir);

/// The class folders of `root`, sorted; a root that is not a folder or holds none is a
/// DataError.
std::vector<std::string> image_folder_classes(const std::string& root);

/// Tar shards of `classes` classes: example k is the k-th image with a class, counting the
/// shards in the order given and each shard's keys in the order stored. The members'
/// offsets are indexed at open, so any example is read directly.
std::shared_ptr<Dataset> open_image_shards(const std::vector<std::string>& paths, int64_t classes,
                                           std::shared_ptr<const ImagePipeline> pipeline);

/// The default cache folder of image-folder indexes: $XDG_CACHE_HOME/vflow, or
/// ~/.cache/vflow.
std::string default_index_cache();

}  // namespace vflow::data
