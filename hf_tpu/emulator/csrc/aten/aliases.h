// The fallback's per-call bookkeeping, shared by the boxed fallback (fallback.cpp) and the unboxed
// kernels (unboxed_ops.cpp): CPU aliases of an op's device tensors, and its results back as device tensors.
#pragma once

#include "aten/fallback.h"
#include "aten/numerics.h"
#include "aten/tensors.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "tpu/gaps.h"

#include <c10/util/MaybeOwned.h>
#include <c10/util/SmallVector.h>

#include <string>

namespace hf_tpu {

// CPU alias tensors reused from call to call (per thread): a TensorImpl costs two allocations (itself and
// its version counter). Only aliases over the kept, non-owning alias storages come here, so a pooled
// alias never keeps memory alive.
class AliasPool {
 public:
  static at::Tensor make(c10::Storage storage, const at::Tensor& like) {
    auto& pool = instance();
    if (pool.empty()) {
      return tensor_over(std::move(storage), like, c10::DispatchKeySet(c10::DispatchKey::CPU));
    }
    at::Tensor alias = std::move(pool.back());
    pool.pop_back();
    c10::TensorImpl* impl = alias.unsafeGetTensorImpl();
    impl->set_storage_and_dtype(std::move(storage), like.dtype());
    impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
    impl->_set_conj(like.is_conj());
    impl->_set_neg(like.is_neg());
    return alias;
  }
  static void give_back(at::Tensor&& alias) {
    auto& pool = instance();
    if (alias.use_count() == 1 && pool.size() < kSize) {
      pool.push_back(std::move(alias));
    }
  }

 private:
  static constexpr size_t kSize = 8;
  static c10::SmallVector<at::Tensor, kSize>& instance() {
    thread_local c10::SmallVector<at::Tensor, kSize> pool;
    return pool;
  }
};

// Per-call bookkeeping: which CPU alias stands for which device tensor/storage. Inline storage for
// the usual handful of entries: no heap allocation for the bookkeeping of a typical op.
//
// Device tensors are borrowed where the caller keeps them alive for the call (the unboxed kernels):
// taking a reference to a tensor Python owns makes torch take the GIL twice (c10's PyObject
// preservation, on the reference count's 1 <-> 2 transitions), which costs more than a small op.
class AliasMap {
 public:
  // `resizable`: whether the kernel may resize (reallocate) the aliases (out= arguments): then each call
  // makes its own alias storages; otherwise it uses the one kept with each device allocation.
  AliasMap(c10::DeviceIndex device, bool resizable) : device_(device), resizable_(resizable) {}
  AliasMap(const AliasMap&) = delete;
  AliasMap& operator=(const AliasMap&) = delete;
  ~AliasMap() {
    if (!resizable_) {
      for (auto& t : tensors_) {
        AliasPool::give_back(std::move(t.alias));
      }
    }
  }

  // `t` must outlive this map.
  at::Tensor to_cpu(const at::Tensor& t) {
    return add(c10::MaybeOwned<at::Tensor>::borrowed(t));
  }
  at::Tensor to_cpu_owned(at::Tensor&& t) {
    return add(c10::MaybeOwned<at::Tensor>::owned(std::move(t)));
  }

  at::Tensor to_device(const at::Tensor& out) {
    if (!out.defined() || out.device().type() == kTpu) {
      return out;
    }
    for (const auto& t : tensors_) {
      if (t.alias_impl == out.unsafeGetTensorImpl()) {
        return *t.device;  // in-place / out= result: the caller's own tensor
      }
    }
    c10::StorageImpl* storage = out.storage().unsafeGetStorageImpl();
    for (const auto& s : storages_) {
      if (s.cpu.unsafeGetStorageImpl() == storage) {
        return device_view(s.device, s.key_set, out);  // a view of an input
      }
    }
    for (const auto& f : fresh_) {
      if (f.cpu == storage) {
        return device_view(f.device.unsafeGetStorageImpl(), f.key_set, out);  // several outputs over one new buffer
      }
    }
    if (take_cpu_output(out, device_)) {
      return out;  // a fresh output, now a device tensor
    }
    at::Tensor wrapped = wrap_cpu_tensor(out, device_);
    fresh_.push_back({storage, wrapped.storage(), wrapped.key_set()});
    return wrapped;
  }

  // After the CPU kernel: an out= argument the kernel resized must take the new
  // geometry (and memory, if it was reallocated) back into the device tensor.
  void write_back_resized() {
    for (const auto& t : tensors_) {
      const at::Tensor& device = *t.device;
      at::TensorImpl* dev = device.unsafeGetTensorImpl();
      const at::Tensor& alias = t.alias;
      if (alias.storage().data_ptr().get() != device.storage().data_ptr().get()) {
        c10::StorageImpl* dst = device.storage().unsafeGetStorageImpl();
        dst->set_data_ptr_noswap(adopt_cpu_storage(alias.storage(), device.device().index()));
        dst->set_nbytes(alias.storage().nbytes());
      }
      if (alias.sizes() != device.sizes() || alias.strides() != device.strides() ||
          alias.storage_offset() != device.storage_offset()) {
        dev->set_sizes_and_strides(alias.sizes(), alias.strides(), alias.storage_offset());
      }
    }
  }

 private:
  struct StorageEntry {
    c10::StorageImpl* device;  // alive as long as the device tensor that has it
    c10::Storage cpu;
    c10::DispatchKeySet key_set;
  };
  struct TensorEntry {
    at::TensorImpl* alias_impl;
    c10::MaybeOwned<at::Tensor> device;
    at::Tensor alias;
  };
  struct FreshEntry {
    c10::StorageImpl* cpu;
    c10::Storage device;
    c10::DispatchKeySet key_set;
  };

  at::Tensor add(c10::MaybeOwned<at::Tensor> device) {
    const at::Tensor& t = *device;
    c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    at::Tensor alias;
    for (const auto& s : storages_) {
      if (s.device == key) {
        alias = resizable_ ? tensor_over(s.cpu, t, c10::DispatchKeySet(c10::DispatchKey::CPU))
                           : AliasPool::make(s.cpu, t);
        break;
      }
    }
    if (!alias.defined()) {
      c10::Storage kept = resizable_ ? c10::Storage() : cpu_alias_storage(t.storage());
      alias = kept ? AliasPool::make(std::move(kept), t) : cpu_alias(t);
      storages_.push_back({key, alias.storage(), t.key_set()});
    }
    tensors_.push_back({alias.unsafeGetTensorImpl(), std::move(device), alias});
    return alias;
  }

  static at::Tensor device_view(c10::StorageImpl* storage, c10::DispatchKeySet key_set, const at::Tensor& out) {
    return tensor_over(c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage)), out, key_set,
                       /*view=*/true);
  }

  c10::DeviceIndex device_;
  bool resizable_;
  c10::SmallVector<StorageEntry, 4> storages_;
  c10::SmallVector<TensorEntry, 4> tensors_;
  c10::SmallVector<FreshEntry, 2> fresh_;
};

// CUDA's message for an op given tensors of two devices, with the fix.
[[noreturn]] inline void mixed_device_error(const std::string& op_name, const std::string& arg_name,
                                            c10::DeviceIndex device, const std::string& other) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, tpu:",
              static_cast<int>(device), " and ", other, "! (when checking argument for argument ", arg_name,
              " in method ", op_name, "). Move the tensor with .to(\"tpu:", static_cast<int>(device),
              "\") first.");
}

}  // namespace hf_tpu
