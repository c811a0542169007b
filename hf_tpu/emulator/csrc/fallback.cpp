// The boxed fallback: every aten op without a native kernel runs its CPU kernel on
// zero-copy CPU aliases of the device tensors. In-place and out= results land in
// device memory; fresh outputs are adopted as device tensors without a copy.
#include "tpu_core.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <mutex>
#include <vector>

namespace hf_tpu {
namespace {

// Per-call bookkeeping: which CPU alias stands for which device tensor/storage. Inline storage for
// the usual handful of entries: no heap allocation for the bookkeeping of a typical op.
class AliasMap {
 public:
  explicit AliasMap(c10::DeviceIndex device) : device_(device) {}

  at::Tensor to_cpu(const at::Tensor& t) {
    c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    at::Tensor alias;
    for (const auto& s : storages_) {
      if (s.device == key) {
        alias = tensor_over(s.cpu, t, c10::DispatchKeySet(c10::DispatchKey::CPU));
        break;
      }
    }
    if (!alias.defined()) {
      alias = cpu_alias(t);
      storages_.push_back({key, alias.storage(), t.storage(), t.key_set()});
    }
    tensors_.push_back({alias.unsafeGetTensorImpl(), t, alias});
    return alias;
  }

  at::Tensor to_device(const at::Tensor& out) {
    if (!out.defined() || out.device().type() == kTpu) {
      return out;
    }
    for (const auto& t : tensors_) {
      if (t.alias_impl == out.unsafeGetTensorImpl()) {
        return t.device;  // in-place / out= result: the caller's own tensor
      }
    }
    c10::StorageImpl* storage = out.storage().unsafeGetStorageImpl();
    for (const auto& s : storages_) {
      if (s.cpu.unsafeGetStorageImpl() == storage) {
        return device_view(s, out);  // a view of an input
      }
    }
    for (const auto& f : fresh_) {
      if (f.cpu == storage) {
        return device_view(f.entry, out);  // several outputs over one new buffer
      }
    }
    at::Tensor wrapped = wrap_cpu_tensor(out, device_);
    fresh_.push_back({storage, {nullptr, out.storage(), wrapped.storage(), wrapped.key_set()}});
    return wrapped;
  }

  // After the CPU kernel: an out= argument the kernel resized must take the new
  // geometry (and memory, if it was reallocated) back into the device tensor.
  void write_back_resized() {
    for (const auto& t : tensors_) {
      at::TensorImpl* dev = t.device.unsafeGetTensorImpl();
      const at::Tensor& alias = t.alias;
      if (alias.storage().data_ptr().get() != t.device.storage().data_ptr().get()) {
        c10::StorageImpl* dst = t.device.storage().unsafeGetStorageImpl();
        dst->set_data_ptr_noswap(adopt_cpu_storage(alias.storage(), t.device.device().index()));
        dst->set_nbytes(alias.storage().nbytes());
      }
      if (alias.sizes() != t.device.sizes() || alias.strides() != t.device.strides() ||
          alias.storage_offset() != t.device.storage_offset()) {
        dev->set_sizes_and_strides(alias.sizes(), alias.strides(), alias.storage_offset());
      }
    }
  }

 private:
  struct StorageEntry {
    c10::StorageImpl* device;  // null for fresh outputs
    c10::Storage cpu;
    c10::Storage device_storage;
    c10::DispatchKeySet key_set;
  };
  struct TensorEntry {
    at::TensorImpl* alias_impl;
    at::Tensor device;
    at::Tensor alias;
  };
  struct FreshEntry {
    c10::StorageImpl* cpu;
    StorageEntry entry;
  };

  static at::Tensor device_view(const StorageEntry& s, const at::Tensor& out) {
    return tensor_over(s.device_storage, out, s.key_set, /*view=*/true);
  }

  c10::DeviceIndex device_;
  c10::SmallVector<StorageEntry, 4> storages_;
  c10::SmallVector<TensorEntry, 4> tensors_;
  c10::SmallVector<FreshEntry, 2> fresh_;
};

bool is_optional_generator(const c10::Argument& arg) {
  const auto& type = arg.type();
  if (type->kind() != c10::TypeKind::OptionalType) {
    return false;
  }
  return type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

[[noreturn]] void mixed_device_error(const c10::OperatorHandle& op, const std::string& arg_name,
                                     c10::DeviceIndex device, const std::string& other) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, tpu:",
              static_cast<int>(device), " and ", other, "! (when checking argument for argument ", arg_name,
              " in method ", op.schema().name(), "). Move the tensor with .to(\"tpu:", static_cast<int>(device),
              "\") first.");
}

// The device an op runs on: that of its first tpu tensor (or tpu Device argument).
c10::DeviceIndex op_device(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t begin) {
  const size_t n = schema.arguments().size();
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& iv = stack[begin + i];
    if (iv.isTensor()) {
      const at::Tensor& t = iv.toTensor();
      if (t.defined() && t.device().type() == kTpu) {
        return t.device().index();
      }
    } else if (iv.isTensorList()) {
      for (const at::Tensor& t : iv.toTensorList()) {
        if (t.defined() && t.device().type() == kTpu) {
          return t.device().index();
        }
      }
    } else if (iv.isDevice() && iv.toDevice().type() == kTpu) {
      return checked_device_index(iv.toDevice().index());
    }
  }
  return current_device();
}

}  // namespace

void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack, const OpRule* rule) {
  const auto& schema = op.schema();
  const auto& arguments = schema.arguments();
  const size_t num_args = arguments.size();
  const size_t begin = stack->size() - num_args;
  const c10::DeviceIndex device = op_device(schema, *stack, begin);
  // copy_ is the one op that moves data between chips.
  const bool cross_device_ok = op.operator_name().name == "aten::copy_";

  AliasMap aliases(device);
  std::vector<c10::IValue> device_args;
  if (rule != nullptr && rule->before != nullptr) {
    device_args.assign(stack->begin() + static_cast<std::ptrdiff_t>(begin), stack->end());
  }
  bool saw_tpu = false;
  bool saw_tpu_device_arg = false;
  bool saw_tpu_generator = false;
  bool saw_cpu_generator = false;
  const std::string* cpu_arg = nullptr;

  auto convert = [&](const at::Tensor& t, const c10::Argument& arg, bool allow_cpu) -> at::Tensor {
    if (!t.defined()) {
      return t;
    }
    if (t.device().type() == kTpu) {
      saw_tpu = true;
      if (t.device().index() != device && !cross_device_ok) {
        mixed_device_error(op, arg.name(), device, t.device().str());
      }
      return aliases.to_cpu(t);
    }
    if (!allow_cpu && t.is_cpu() && t.dim() > 0 && cpu_arg == nullptr) {
      cpu_arg = &arg.name();
    }
    return t;
  };

  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& iv = (*stack)[begin + i];
    const auto& arg = arguments[i];
    if (iv.isTensor()) {
      iv = convert(iv.toTensor(), arg, false);
    } else if (iv.isTensorList()) {
      auto list = iv.toTensorList();
      c10::List<at::Tensor> converted;
      converted.reserve(list.size());
      for (const at::Tensor& t : list) {
        converted.push_back(convert(t, arg, false));
      }
      iv = std::move(converted);
    } else if (iv.isOptionalTensorList()) {
      // Index lists (index, index_put_): CUDA accepts CPU index tensors here too.
      auto list = iv.toOptionalTensorList();
      c10::List<std::optional<at::Tensor>> converted;
      converted.reserve(list.size());
      for (const std::optional<at::Tensor>& t : list) {
        converted.push_back(t.has_value() ? std::optional<at::Tensor>(convert(*t, arg, true)) : std::nullopt);
      }
      iv = std::move(converted);
    } else if (iv.isDevice()) {
      if (iv.toDevice().type() == kTpu) {
        saw_tpu_device_arg = true;
        iv = c10::Device(c10::DeviceType::CPU);
      }
    } else if (iv.isGenerator()) {
      const at::Generator& gen = iv.toGenerator();
      if (is_tpu_generator(gen)) {
        saw_tpu_generator = true;
        iv = cpu_generator_of(gen);
      } else if (gen.defined() && gen.device().type() == c10::DeviceType::CPU) {
        saw_cpu_generator = true;
      }
    } else if (iv.isNone() && is_optional_generator(arg)) {
      // Draw from the device's default generator, not the CPU's.
      iv = cpu_generator_of(default_generator(device));
    }
  }

  if (!saw_tpu && !saw_tpu_device_arg) {
    TORCH_CHECK(!saw_tpu_generator, "Expected a 'cpu' device type for generator but found 'tpu' (in ",
                schema.name(), "): a tpu Generator can only draw into tpu tensors.");
  }
  // As CUDA: a CPU generator cannot draw numbers for the device.
  TORCH_CHECK(!(saw_cpu_generator && (saw_tpu || saw_tpu_device_arg)),
              "Expected a 'tpu' device type for generator but found 'cpu' (in ", schema.name(),
              "): create it with torch.Generator(device='tpu').");
  if (saw_tpu && cpu_arg != nullptr) {
    mixed_device_error(op, *cpu_arg, device, "cpu");
  }

  check_gaps_before(op, stack, begin);
  if (rule != nullptr && rule->before != nullptr) {
    rule->before(op, stack, begin, device_args);
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  aliases.write_back_resized();
  const size_t num_returns = schema.returns().size();
  const size_t rbegin = stack->size() - num_returns;
  if (rule != nullptr && rule->after != nullptr) {
    rule->after(op, stack, rbegin);
  }
  for (size_t i = 0; i < num_returns; ++i) {
    c10::IValue& iv = (*stack)[rbegin + i];
    if (iv.isTensor()) {
      iv = aliases.to_device(iv.toTensor());
    } else if (iv.isTensorList()) {
      auto list = iv.toTensorList();
      c10::List<at::Tensor> converted;
      converted.reserve(list.size());
      for (const at::Tensor& t : list) {
        converted.push_back(aliases.to_device(t));
      }
      iv = std::move(converted);
    }
  }
}

namespace {

void tpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_on_cpu(op, stack, nullptr);
}

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>());
}

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

// Composite kernels beat a backend fallback. Route to the CPU kernels the ops that have both
// a CPU kernel and a CompositeExplicitAutograd one, so results are bit-identical to CPU; and the
// structured ops (add, mul, pow, mean, silu, ...), whose CompositeExplicitAutogradNonFunctional
// kernel would build a TensorIterator over the device tensors, allocate the output through the
// dispatcher and call the out= op through the fallback: two TensorIterators and three dispatches
// per op, where the CPU kernel needs one of each.
// (convolution, whose composite would call a *_overrideable hook, has a kernel in numerics.cpp.)
std::vector<std::string> route_composites_to_cpu() {
  static std::once_flag once;
  static std::vector<std::string> routed;
  std::call_once(once, [] {
    // Leaked on purpose: a Library destroyed at exit would deregister kernels torch may still call.
    auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    auto& dispatcher = c10::Dispatcher::singleton();
    std::vector<std::string> names;
    for (const auto& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) {
        continue;
      }
      auto handle = dispatcher.findOp(name);
      if (handle && handle->hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
          (handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
           handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) &&
          !handle->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
        names.push_back(name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name));
      }
    }
    for (const auto& name : names) {
      lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>());
      routed.push_back(name);
    }
  });
  return routed;
}

}  // namespace hf_tpu

namespace at::autocast {
namespace {
// Autocast on "tpu": the same op lists and policies as CUDA, bf16 by default.
#define KERNEL_TPU_LOW_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define KERNEL_TPU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define KERNEL_TPU_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define KERNEL_TPU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(KERNEL_TPU_LOW_PRECISION_FP)
  AT_FORALL_FP32(KERNEL_TPU_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(KERNEL_TPU_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(KERNEL_TPU_PROMOTE)
}

}  // namespace
}  // namespace at::autocast
