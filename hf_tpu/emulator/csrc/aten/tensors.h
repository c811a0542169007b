// Device tensors over host memory: views of storages, CPU aliases of device tensors and back.
#pragma once

#include "core.h"

namespace hf_tpu {

// A tensor over `storage` with the sizes, strides, offset and conj/neg bits of `like`.
// `view` makes a view TensorImpl; `keys` must then be the base's key set (autograd keys included).
at::Tensor tensor_over(c10::Storage storage, const at::Tensor& like, c10::DispatchKeySet keys,
                       bool view = false);
// A CPU tensor over the same memory (sizes, strides, offset, conj/neg bits).
at::Tensor cpu_alias(const at::Tensor& tpu_tensor);
// A device tensor over a CPU tensor's memory: zero-copy, counted as memory of `device`.
at::Tensor wrap_cpu_tensor(const at::Tensor& cpu_tensor, c10::DeviceIndex device);
// Data-less CPU stand-in (shape, strides, dtype only) for code that inspects metadata.
at::Tensor cpu_standin(const at::Tensor& tpu_tensor);
bool has_real_storage(const at::Tensor& t);

}  // namespace hf_tpu
