// Text files as entries: the reading that text data sets and vflow-tokenize share. No
// LibTorch, so that a tool linking another protobuf (SentencePiece's) can use it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace vflow::data {

/// Files named by `paths`: a file as it is, a directory as its regular files in name
/// order (not recursive), skipping fortune's index files (*.dat) and its *.u8 links.
/// A path that does not exist, or a directory without files, is a DataError.
std::vector<std::string> expand_text_paths(const std::vector<std::string>& paths);

/// The entries of one text file. A file with lines holding only "%" (fortune's
/// format) has one entry per block between them; any other file has one entry per
/// non-empty line. Lines are joined with '\n' and trailing whitespace is removed.
/// A file that cannot be read, or holds a NUL byte (not text), is a DataError naming
/// the file (and the byte offset).
std::vector<std::string> read_text_entries(const std::string& path);

/// Sentences of an entry: whitespace collapsed to single spaces, split after '.', '!'
/// or '?' followed by a space; sentences shorter than `min_bytes` are dropped.
std::vector<std::string> split_sentences(const std::string& entry, size_t min_bytes);

}  // namespace vflow::data
