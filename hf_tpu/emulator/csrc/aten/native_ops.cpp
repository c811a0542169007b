// Native kernels: the ops that create, view, resize and copy device memory. Everything
// else goes through the boxed fallback (fallback.cpp), which needs exactly these.
#include "aten/attention.h"
#include "aten/fallback.h"
#include "aten/tensors.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "tpu/executables.h"
#include "tpu/gaps.h"
#include "tpu/tracking.h"

#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>
#include <ATen/ops/_fused_sdp_choice_ops.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/GradMode.h>
#include <torch/library.h>

namespace hf_tpu {

at::Tensor tensor_over(c10::Storage storage, const at::Tensor& like, c10::DispatchKeySet keys,
                       bool view) {
  auto out = view ? at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, std::move(storage), keys, like.dtype())
                  : at::detail::make_tensor<c10::TensorImpl>(std::move(storage), keys, like.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) {
    out._set_conj(true);
  }
  if (like.is_neg()) {
    out._set_neg(true);
  }
  return out;
}

bool has_real_storage(const at::Tensor& t) {
  return t.has_storage() && !t.key_set().has(c10::DispatchKey::Python) &&
         t.storage().device_type() == kTpu;
}

namespace {

// The chip a factory allocates on: its device argument's index, else the current device.
c10::DeviceIndex factory_device(std::optional<c10::Device> device) {
  return checked_device_index(device.has_value() && device->has_index() ? device->index() : -1);
}

}  // namespace

at::Tensor cpu_alias(const at::Tensor& t) {
  const auto& storage = t.storage();
  // Non-owning view of the device memory; resizable so an out= kernel may grow it
  // (the fallback adopts the new memory into the device storage afterwards).
  c10::Storage alias(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), storage.nbytes(),
      c10::DataPtr(const_cast<void*>(storage.data_ptr().get()), c10::Device(c10::DeviceType::CPU)),
      c10::GetCPUAllocator(), /*resizable=*/true));
  return tensor_over(std::move(alias), t, c10::DispatchKeySet(c10::DispatchKey::CPU));
}

at::Tensor cpu_standin(const at::Tensor& t) {
  const auto nbytes = at::detail::computeStorageNbytes(t.sym_sizes(), t.sym_strides(), t.dtype().itemsize(),
                                                       t.sym_storage_offset());
  c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), nbytes.guard_int(__FILE__, __LINE__),
      c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)), nullptr, /*resizable=*/false));
  auto out = tensor_over(std::move(storage), t, c10::DispatchKeySet(c10::DispatchKey::CPU));
  if (t.requires_grad()) {
    out.unsafeGetTensorImpl()->set_requires_grad(true);
  }
  return out;
}

at::Tensor wrap_cpu_tensor(const at::Tensor& cpu, c10::DeviceIndex device) {
  c10::Storage device_storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), cpu.storage().nbytes(), adopt_cpu_storage(cpu.storage(), device),
      device_allocator(), /*resizable=*/true));
  return tensor_over(std::move(device_storage), cpu, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1));
}

namespace {

constexpr c10::DispatchKeySet kTpuKeys(c10::DispatchKey::PrivateUse1);

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> /*pin_memory*/,
                               std::optional<c10::MemoryFormat> memory_format) {
  DeviceScope scope(factory_device(device));
  TORCH_CHECK(!layout.has_value() || *layout == c10::kStrided, "TPU tensors support only the strided layout, got ",
              *layout);
  return at::detail::empty_generic(size, device_allocator(), kTpuKeys, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> /*pin_memory*/) {
  DeviceScope scope(factory_device(device));
  TORCH_CHECK(!layout.has_value() || *layout == c10::kStrided, "TPU tensors support only the strided layout, got ",
              *layout);
  return at::detail::empty_strided_generic(size, stride, device_allocator(), kTpuKeys, c10::dtype_or_default(dtype));
}

// Autograd returns "efficient zero tensors" (no memory, ZeroTensor key) for gradients
// known to be zero; build them as CUDA does, with a null device allocation.
struct ZeroTensorAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t /*nbytes*/) override {
    return {nullptr, nullptr, [](void*) {}, c10::Device(kTpu, current_device())};
  }
  void copy_data(void* /*dest*/, const void* /*src*/, std::size_t /*count*/) const override {}
};

at::Tensor efficient_zero_tensor(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                                 std::optional<c10::Layout> /*layout*/, std::optional<c10::Device> device,
                                 std::optional<bool> /*pin_memory*/) {
  DeviceScope scope(factory_device(device));
  static ZeroTensorAllocator allocator;
  const auto keys = kTpuKeys | c10::DispatchKeySet(c10::DispatchKey::ZeroTensor);
  return at::detail::empty_generic(size, &allocator, keys, c10::dtype_or_default(dtype), std::nullopt);
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  return at::native::resize_(self, size, memory_format);
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, int64_t storage_offset,
                               c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::set_storage_cpu_(self, std::move(source), storage_offset, size, stride);
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return at::native::set_storage_cpu_(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor& set_empty(at::Tensor& self) {
  DeviceScope scope(self.device().index());
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, device_allocator(), /*resizable=*/true);
  return at::native::set_storage_cpu_(self, std::move(storage), 0, {0}, {});
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  const bool src_tpu = self.device().type() == kTpu;
  const bool dst_tpu = dst.device().type() == kTpu;
  TORCH_CHECK((src_tpu || self.is_cpu()) && (dst_tpu || dst.is_cpu()),
              "Copies with the emulated TPU support cpu and tpu tensors, got ", self.device(), " -> ",
              dst.device());
  at::Tensor src_cpu = src_tpu ? cpu_alias(self) : self;
  at::Tensor dst_cpu = dst_tpu ? cpu_alias(dst) : dst;
  if (src_tpu && dst_tpu && self.scalar_type() != dst.scalar_type()) {
    // A conversion on the chip is an executable (a copy between buffers of one dtype is not).
    KeyHasher key;
    key.mix(uint64_t{0xc0417e});
    key.mix(self);
    key.mix(uint64_t{static_cast<uint64_t>(dst.scalar_type())});
    record_executable(key.value, "aten::_to_copy");
  }
  dst_cpu.copy_(src_cpu);
  if (src_tpu && !dst_tpu) {
    record_event(Event::kDeviceToHost, static_cast<int64_t>(dst.nbytes()), "copy to cpu");
  } else if (!src_tpu && dst_tpu) {
    record_event(Event::kHostToDevice, static_cast<int64_t>(dst.nbytes()), "copy to tpu");
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  record_event(Event::kSync, static_cast<int64_t>(self.dtype().itemsize()), "item");
  return at::_local_scalar_dense(cpu_alias(self));
}

// CUDA (hence TorchTPU and the models that branch on device type) accepts integer
// inputs to histc; the CPU kernel does not. Compute in float and cast back.
at::Tensor histc(const at::Tensor& self, int64_t bins, const c10::Scalar& min, const c10::Scalar& max) {
  at::Tensor cpu = cpu_alias(self);
  const c10::DeviceIndex device = self.device().index();
  if (at::isIntegralType(self.scalar_type(), /*includeBool=*/true)) {
    return wrap_cpu_tensor(at::histc(cpu.to(at::kFloat), bins, min, max).to(self.scalar_type()), device);
  }
  return wrap_cpu_tensor(at::histc(cpu, bins, min, max), device);
}

// SDPA picks its backend through a DispatchStub, not the dispatcher: answer as the CPU
// would, on data-less stand-ins (also safe for FakeTensors while Dynamo traces).
int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  auto choose = [&](bool mask_requires_grad) {
    std::optional<at::Tensor> mask;
    if (attn_mask.has_value() && attn_mask->defined()) {
      mask = cpu_standin(*attn_mask);
      mask->unsafeGetTensorImpl()->set_requires_grad(mask_requires_grad && attn_mask->requires_grad());
    }
    // Straight to the CPU kernel: under FakeTensorMode (Dynamo tracing) the Python modes must
    // not see these stand-ins.
    return at::_ops::_fused_sdp_choice::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), cpu_standin(query),
                                                   cpu_standin(key), cpu_standin(value), mask, dropout_p, is_causal,
                                                   scale, enable_gqa);
  };
  const int64_t choice = choose(true);
  // Gap differentiable_attention_mask: TorchTPU takes the flash kernel even for a mask that
  // requires grad (the CPU would take the math path), whose autograd then refuses the mask.
  if (choice == static_cast<int64_t>(sdp::SDPBackend::math) && gap_enabled(Gap::kDifferentiableAttentionMask) &&
      attn_mask.has_value() && attn_mask->defined() && attn_mask->requires_grad() && at::GradMode::is_enabled()) {
    return choose(false);
  }
  return choice;
}

// `param.data = t` and Module.to() swap a tensor's storage in place only for "shallow-copy
// compatible" pairs; c10 lists CPU/CUDA/XPU... but not PrivateUse1, and asks backends to say
// so themselves. Gap weight_tying: TorchTPU does not declare tpu and CPU tensors compatible,
// so Module.to("tpu") replaces parameters (untying tied ones) and `param.data = tpu_tensor`
// raises. The "ideal" profile declares them compatible, as CUDA and CPU are.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == at::kStrided && (t.is_cpu() || t.device().is_privateuseone());
  };
  if (!gap_enabled(Gap::kWeightTying) && dense(self) && dense(from)) {
    return true;
  }
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("_efficientzerotensor", TORCH_FN(efficient_zero_tensor));
  m.impl("as_strided", TORCH_FN(as_strided));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage_offset));
  m.impl("set_.source_Storage", TORCH_FN(set_storage));
  m.impl("set_.source_Tensor", TORCH_FN(set_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("histc", TORCH_FN(histc));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
}

}  // namespace hf_tpu

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &hf_tpu::fused_sdp_choice);
}  // namespace at::native

// Copies carry conj/neg bits over to the CPU aliases and the CPU copy resolves them, so
// the Conjugate/Negative fallbacks must not materialise them first (they would clone,
// which copies, which calls _copy_from again: endless recursion).
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
