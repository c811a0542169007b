// What every piece of the emulated TPU core shares: the device type. Each piece has its own header:
//
//   runtime/  what torch asks of a device: allocator.h (HBM), device.h (host model, current device),
//             generator.h, pinned.h, and guard.cpp / hooks.cpp (torch's DeviceGuardImpl and PrivateUse1 hooks)
//   aten/     how ops run: tensors.h (device tensors over CPU memory), fallback.h (every op on its CPU kernel),
//             numerics.h and attention.h (a chip's numerics), native_ops.cpp, unboxed_ops.cpp, aliases.h
//   tpu/      what makes it TorchTPU: gaps.h (the gaps the core reproduces), executables.h (its eager executable
//             cache, modelled), tracking.h (transfer and sync counters)
//   bindings.cpp  the Python module, hf_tpu.emulator._C
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Storage.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace hf_tpu {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;
// Chips a process may address at most.
constexpr int kMaxDevices = 64;

}  // namespace hf_tpu
