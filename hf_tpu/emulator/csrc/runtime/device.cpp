// The host model: a process can use `usable` chips, tpu:0..usable-1 (a plain process on a multi-chip host sees
// them all; a torchrun rank sees its own chip as tpu:0), and device_count() reports `reported`. It is bound to
// tpu:0: ops run on whichever chip their tensors are on (the guard switches internally), but
// torch.accelerator.set_device_index() to another chip raises, as on TorchTPU.
#include "runtime/device.h"
#include "aten/fallback.h"
#include "runtime/allocator.h"

#include <sstream>

namespace hf_tpu {
namespace {
std::atomic<int> g_usable{1};
std::atomic<int> g_reported{1};
thread_local c10::DeviceIndex t_current_device = 0;

}  // namespace

void check_bound(c10::DeviceIndex index) {
  const int usable = g_usable.load();
  TORCH_CHECK(index < usable, "Device index ", static_cast<int>(index),
              " is out of bounds of the number of addressable devices ", usable);  // TorchTPU's words
  TORCH_CHECK_VALUE(
      index <= 0, "Cannot set TPU device to index ", static_cast<int>(index),
      ", current process is bound to device index 0. Changing the active TPU device within a process is not "
      "supported (as on TorchTPU): put tensors on tpu:", static_cast<int>(index),
      " explicitly, or launch one process per chip (`hf-tpu launch -n N`).");
}

void set_device_counts(int usable, int reported) {
  TORCH_CHECK(usable >= 1 && usable <= kMaxDevices && reported >= usable && reported <= kMaxDevices,
              "hf-tpu emulator: invalid device counts (usable ", usable, ", reported ", reported, ")");
  g_usable = usable;
  g_reported = reported;
}
namespace {
std::atomic<bool> g_rebind_pending{false};
std::function<void()>* g_rebind_hook = nullptr;  // leaked on purpose, like the hooks
}  // namespace

void set_rebind_hook(std::function<void()> hook) {
  delete g_rebind_hook;
  g_rebind_hook = new std::function<void()>(std::move(hook));
}
void mark_forked() {
  g_rebind_pending.store(true, std::memory_order_release);
}
void rebind_if_forked() {
  if (g_rebind_pending.load(std::memory_order_relaxed) && g_rebind_pending.exchange(false) && g_rebind_hook) {
    try {
      (*g_rebind_hook)();
    } catch (...) {
      mark_forked();  // not bound yet: the next device use raises the same error
      throw;
    }
  }
}

int usable_device_count() {
  rebind_if_forked();
  return g_usable.load();
}
int reported_device_count() {
  return g_reported.load();
}
c10::DeviceIndex current_device() {
  return t_current_device;
}

c10::DeviceIndex checked_device_index(c10::DeviceIndex index) {
  rebind_if_forked();
  if (index < 0) {
    return t_current_device;
  }
  const int usable = g_usable.load();
  if (index < usable) {
    return index;
  }
  const int reported = g_reported.load();
  std::ostringstream why;
  if (index < reported) {
    why << "tpu:" << static_cast<int>(index) << " is not visible to this process: it can use " << usable
        << " of the host's " << reported
        << " chip(s) (TPU_VISIBLE_DEVICES / TPU_VISIBLE_CHIPS), but device_count() still reports " << reported
        << " (TorchTPU gap 'visible_devices'). Use tpu:0..tpu:" << usable - 1 << ".";
  } else if (usable == 1) {  // TorchTPU's words first, then what to do
    why << "Device index " << static_cast<int>(index) << " is out of bounds of the number of addressable devices 1"
        << ": this process has one TPU chip, tpu:0 (a torchrun rank sees only its own chip; launch one process per "
           "chip with `hf-tpu launch -n N`, or emulate a larger host with HF_TPU_EMULATOR_CHIPS).";
  } else {
    why << "Device index " << static_cast<int>(index) << " is out of bounds of the number of addressable devices "
        << usable << ": this process has " << usable << " TPU chips, tpu:0..tpu:" << usable - 1 << ".";
  }
  TORCH_CHECK(false, why.str());
  return 0;  // unreachable
}

DeviceScope::DeviceScope(c10::DeviceIndex index) : previous_(t_current_device) {
  t_current_device = checked_device_index(index);
}
DeviceScope::~DeviceScope() {
  t_current_device = previous_;
}

c10::DeviceIndex exchange_current_device(c10::DeviceIndex index) {
  const c10::DeviceIndex previous = t_current_device;
  t_current_device = checked_device_index(index);
  return previous;
}

void set_current_device_unchecked(c10::DeviceIndex index) {
  t_current_device = index;
}

}  // namespace hf_tpu
