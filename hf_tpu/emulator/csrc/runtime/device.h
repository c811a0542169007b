// The host model: which chips a process can use and report, and each thread's current chip.
#pragma once

#include "core.h"

#include <functional>

namespace hf_tpu {

// The host model: `usable` devices tpu:0..usable-1 can hold tensors; device_count()
// reports `reported` (more than usable when TPU_VISIBLE_DEVICES is ignored, as on TorchTPU).
void set_device_counts(int usable, int reported);
// A forked child re-reads its host binding (LOCAL_RANK...) on its first device use, as TorchTPU's runtime
// initialises lazily: mark_forked() arms it, rebind_if_forked() runs `hook` once (under the GIL).
void set_rebind_hook(std::function<void()> hook);
void mark_forked();
void rebind_if_forked();
int usable_device_count();
int reported_device_count();
// The calling thread's current device (the process's own chip unless a guard switched it).
c10::DeviceIndex current_device();
// Throws a clear error unless `index` names a usable device (-1 means "current").
c10::DeviceIndex checked_device_index(c10::DeviceIndex index);
class DeviceScope {
 public:
  explicit DeviceScope(c10::DeviceIndex index);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  c10::DeviceIndex previous_;
};
// TorchTPU's rule for an explicit set_device: an index this process can address, and none but its own chip.
void check_bound(c10::DeviceIndex index);
// Make `index` (checked; -1: current) the calling thread's device; returns the previous one (device guards).
c10::DeviceIndex exchange_current_device(c10::DeviceIndex index);
// Set the calling thread's device without checks (a guard restoring a device it saved).
void set_current_device_unchecked(c10::DeviceIndex index);

}  // namespace hf_tpu
