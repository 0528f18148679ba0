// The one place where LibTorch version differences live (1.13 on Debian 12, 2.x on
// Debian 13 and in PyTorch's builds). Everything else calls these helpers.
#pragma once

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace vflow::compat {

template <typename T, typename = void>
struct has_use_libuv : std::false_type {};
template <typename T>
struct has_use_libuv<T, std::void_t<decltype(std::declval<T&>().useLibUV)>> : std::true_type {};

inline void set_deterministic_algorithms(bool enabled) {
  at::globalContext().setDeterministicAlgorithms(enabled, /*warn_only=*/false);
  // cuDNN: deterministic kernels, and no benchmark-driven choice between them.
  at::globalContext().setDeterministicCuDNN(enabled);
  if (enabled) at::globalContext().setBenchmarkCuDNN(false);
}

/// float32 stays float32 on every device: no TF32 in cuBLAS matrix products or cuDNN
/// convolutions (LibTorch lets cuDNN use TF32 on Ampere and Hopper by default), so that an
/// fp32 job's result does not depend on the GPU generation, and CPU-vs-GPU comparisons hold
/// at float32 tolerances. Reduced precision is what `semantic.precision: bf16` is for.
inline void use_full_float32() {
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
}

/// Mixed precision for one forward pass on `device`: matrix products and convolutions
/// in `dtype`, the rest as autocast decides (parameters stay float32). Autocast state is
/// per thread; the cache of cast weights is cleared when the outermost guard ends.
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device, bool enabled, at::ScalarType dtype = at::kBFloat16)
      : device_(device), enabled_(enabled) {
    if (!enabled_) return;
    was_enabled_ = is_enabled(device_);
    was_dtype_ = get_dtype(device_);
    set_enabled(device_, true);
    set_dtype(device_, dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!enabled_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    set_enabled(device_, was_enabled_);
    set_dtype(device_, was_dtype_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  static bool is_enabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
  static void set_enabled(c10::DeviceType d, bool on) { at::autocast::set_autocast_enabled(d, on); }
  static at::ScalarType get_dtype(c10::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
  static void set_dtype(c10::DeviceType d, at::ScalarType t) {
    at::autocast::set_autocast_dtype(d, t);
  }
#else
  static bool is_enabled(c10::DeviceType d) {
    return d == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
  }
  static void set_enabled(c10::DeviceType d, bool on) {
    if (d == c10::DeviceType::CPU) {
      at::autocast::set_cpu_enabled(on);
    } else {
      at::autocast::set_enabled(on);
    }
  }
  static at::ScalarType get_dtype(c10::DeviceType d) {
    return d == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                     : at::autocast::get_autocast_gpu_dtype();
  }
  static void set_dtype(c10::DeviceType d, at::ScalarType t) {
    if (d == c10::DeviceType::CPU) {
      at::autocast::set_autocast_cpu_dtype(t);
    } else {
      at::autocast::set_autocast_gpu_dtype(t);
    }
  }
#endif
  c10::DeviceType device_;
  bool enabled_;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kBFloat16;
};

/// Store options for c10d's classic TCPStore server, on every LibTorch. LibTorch 2.x
/// adds a libuv server and makes it the default, but builds without libuv (Debian's,
/// for one) refuse that default, clients included; the classic server is the one 1.13
/// has, and it serves the few keys a job exchanges alike.
template <typename StoreOptions>
void use_classic_store(StoreOptions& options) {
  if constexpr (has_use_libuv<StoreOptions>::value) options.useLibUV = false;
}

/// The key of parameter `p` in a LibTorch optimizer's state map `Map`: the TensorImpl's
/// address as text in 1.13 (as c10::guts::to_string writes it), the address itself in
/// 2.x.
template <typename Map, typename Tensor>
typename Map::key_type optimizer_state_key(const Tensor& p) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;
    out << p.unsafeGetTensorImpl();
    return out.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

/// A LibTorch error message without the C++ backtrace.
inline std::string message_of(const c10::Error& e) { return e.what_without_backtrace(); }

}  // namespace vflow::compat
