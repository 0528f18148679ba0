// LibTorch's optimizer archive (what torch::optim::Optimizer::save writes), read by each
// parameter's place rather than by LibTorch's keys.
//
// The archive keeps each parameter's state under a key made from the address of the
// parameter's TensorImpl, and lists those keys in parameter order under "param_groups".
// The key's text differs between LibTorch versions (1.13 writes the address in hex, 2.x in
// decimal and parses it back as a number), so LibTorch 2.x's own load of a 1.13 file gives
// the parameters one another's state. Matched through the list, by position, a state
// lands on its own parameter in any version.
#pragma once

#include <cstddef>
#include <functional>

namespace torch::serialize {
class InputArchive;
}

namespace vflow::engine {

/// Calls `restore(i, state)` for each parameter i of the archive's list (every parameter
/// group's, in order) that has a state in it, in ascending i. Throws Error where the archive
/// is not an optimizer archive or lists other than `parameters` parameters.
void for_each_saved_state(
    torch::serialize::InputArchive& archive, size_t parameters,
    const std::function<void(size_t, torch::serialize::InputArchive&)>& restore);

}  // namespace vflow::engine
