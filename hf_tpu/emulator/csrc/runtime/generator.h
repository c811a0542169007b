// Random generators of the device: each wraps a CPU generator that the CPU kernels draw from.
#pragma once

#include "core.h"

namespace hf_tpu {

// Each device's default generator and the CPU generator a tpu generator wraps.
const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator cpu_generator_of(const at::Generator& tpu_generator);
bool is_tpu_generator(const at::Generator& generator);
// A fresh generator of device `index` (an addressable index).
at::Generator new_generator(c10::DeviceIndex index);

}  // namespace hf_tpu
