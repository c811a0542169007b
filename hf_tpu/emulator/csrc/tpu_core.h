// Shared declarations of the emulated TPU core: a CPU-memory-backed PrivateUse1 device.
//
// Layering: allocator.cpp (HBM accounting) <- runtime.cpp (guard, hooks, generator)
//           <- native_ops.cpp (factories, views, copies) <- fallback.cpp (every other op)
//           <- bindings.cpp (the Python surface of `hf_tpu.emulator._C`).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Storage.h>

#include <atomic>
#include <cstdint>

namespace hf_tpu {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;

// ---- allocator.cpp -------------------------------------------------------
// The device allocator: host memory, HBM-style accounting, a capacity per chip.
c10::DeviceAllocator* device_allocator();
void set_capacity(int64_t bytes);
int64_t capacity();
// Largest single allocation (bytes) since the previous call; resets it.
int64_t take_largest_allocation();
// Adopt a CPU storage's memory as device memory without copying. The returned
// DataPtr keeps the CPU storage alive and counts its bytes as allocated; it
// raises torch.OutOfMemoryError (freeing nothing of the caller's) if the
// capacity would be exceeded.
c10::DataPtr adopt_cpu_storage(const c10::Storage& cpu_storage);

// ---- runtime.cpp ---------------------------------------------------------
// The device's default generator and the CPU generator it wraps.
const at::Generator& default_generator();
at::Generator cpu_generator_of(const at::Generator& tpu_generator);
bool is_tpu_generator(const at::Generator& generator);

// ---- native_ops.cpp / fallback.cpp --------------------------------------
// A tensor over `storage` with the sizes, strides, offset and conj/neg bits of `like`.
// `view` makes a view TensorImpl; `keys` must then be the base's key set (autograd keys included).
at::Tensor tensor_over(c10::Storage storage, const at::Tensor& like, c10::DispatchKeySet keys,
                       bool view = false);
// A CPU tensor over the same memory (sizes, strides, offset, conj/neg bits).
at::Tensor cpu_alias(const at::Tensor& tpu_tensor);
// A device tensor over a CPU tensor's memory: zero-copy, counted as device memory.
at::Tensor wrap_cpu_tensor(const at::Tensor& cpu_tensor);
// Data-less CPU stand-in (shape, strides, dtype only) for code that inspects metadata.
at::Tensor cpu_standin(const at::Tensor& tpu_tensor);
bool has_real_storage(const at::Tensor& t);

// ---- transfer and sync counters (bindings.cpp) --------------------------
enum class Event : int { kHostToDevice = 0, kDeviceToHost = 1, kSync = 2 };
struct Counter {
  std::atomic<int64_t> count{0};
  std::atomic<int64_t> bytes{0};
};
Counter& counter(Event e);
// Called on each event; forwards to the Python tracker when one is active.
void record_event(Event e, int64_t nbytes, const char* what);

}  // namespace hf_tpu
