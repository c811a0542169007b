// The device allocator: host memory with HBM accounting and a capacity per chip, the chips a process holds.
#pragma once

#include "core.h"

#include <string>
#include <vector>

namespace hf_tpu {

// The device allocator: host memory, HBM-style accounting per chip, a capacity per chip.
// Allocations land on the calling thread's current device (see DeviceScope).
c10::DeviceAllocator* device_allocator();
void set_capacity(int64_t bytes);
int64_t capacity();
// Largest single allocation (bytes) since the previous call; resets it.
int64_t take_largest_allocation();
// Adopt a CPU storage's memory as memory of `device` without copying. The returned
// DataPtr keeps the CPU storage alive and counts its bytes as allocated; it
// raises torch.OutOfMemoryError (freeing nothing of the caller's) if the
// capacity would be exceeded.
c10::DataPtr adopt_cpu_storage(const c10::Storage& cpu_storage, c10::DeviceIndex device);
// Make a CPU kernel's fresh output (held only by the caller, memory from torch's CPU allocator) a tensor
// of `device` in place: no new tensor, storage or copy. False (nothing changed) if it is not such an output.
bool take_cpu_output(const at::Tensor& cpu_out, c10::DeviceIndex device);
// A CPU storage over a device storage's memory, made once per allocation (not resizable); undefined
// for memory this allocator does not track (e.g. empty or zero tensors).
c10::Storage cpu_alias_storage(const c10::Storage& device_storage);
// One lock file per local device: a chip is opened (locked) on its first allocation, as
// TorchTPU's runtime opens the chips lazily. Empty paths: no locking.
void set_device_locks(std::vector<std::string> paths, std::vector<std::string> labels);
// Whether this process has opened (locked) any chip yet.
bool any_device_opened();
// Storages whose memory Python may own (DLPack, NumPy), freed on another thread (autograd's device
// workers), wait here for the main thread: its next allocation, or exit.
void release_deferred_storages();

}  // namespace hf_tpu
