// The GNU build id of a loaded library or an ELF file: what tells two builds of one
// version apart (job::build_identity, the kernel signature of cross-checks).
#pragma once

#include <string>

namespace vflow {

/// The GNU build id, in hex, of the ELF file at `path`, read from its note segments
/// without loading it; empty when it cannot be read or has none.
std::string file_build_id(const std::string& path);

/// The GNU build id, in hex, of the loaded object (the program or a shared library) that
/// holds `address`; empty when none is found (a program that is not position independent).
std::string loaded_build_id(const void* address);

}  // namespace vflow
