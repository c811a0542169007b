// The boxed fallback: every aten op without a native kernel runs its CPU kernel on
// zero-copy CPU aliases of the device tensors. In-place and out= results land in
// device memory; fresh outputs are adopted as device tensors without a copy.
#include "aten/fallback.h"
#include "aten/aliases.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/generator.h"
#include "tpu/executables.h"
#include "tpu/gaps.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <mutex>
#include <vector>

namespace hf_tpu {
namespace {

bool is_optional_generator(const c10::Argument& arg) {
  const auto& type = arg.type();
  if (type->kind() != c10::TypeKind::OptionalType) {
    return false;
  }
  return type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType;
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

bool is_scalar_argument(const c10::Argument& arg) {
  const auto& type = arg.type();
  if (type->kind() == c10::TypeKind::NumberType) {
    return true;
  }
  return type->kind() == c10::TypeKind::OptionalType &&
         type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::NumberType;
}

// The executable TorchTPU would run for this call (0: none, a transfer between host and chip).
uint64_t executable_key(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t begin, size_t n) {
  const auto& name = op.operator_name();
  KeyHasher h;
  h.mix(std::hash<std::string>{}(name.name) ^ (std::hash<std::string>{}(name.overload_name) << 1));
  bool on_host = false;
  bool on_chip = false;
  const auto& arguments = op.schema().arguments();
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& iv = stack[begin + i];
    if (iv.isTensor() && iv.toTensor().defined() && iv.toTensor().dim() > 0) {
      (iv.toTensor().device().type() == kTpu ? on_chip : on_host) = true;
    }
    if (is_scalar_argument(arguments[i]) && (iv.isInt() || iv.isDouble() || iv.isBool())) {
      h.mix(iv.toScalar());  // a Scalar: its kind, not its value (a Python int arrives as an int)
    } else {
      h.mix(iv);
    }
  }
  if (name.name == "aten::copy_" && on_host && on_chip) {
    return 0;
  }
  return h.value == 0 ? 1 : h.value;
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

  const uint64_t executable = executable_key(op, *stack, begin, num_args);

  // Ops that write an argument (in place, out=) may resize it.
  AliasMap aliases(device, /*resizable=*/schema.is_mutable());
  std::vector<c10::IValue> device_args;
  if (rule != nullptr && rule->before != nullptr) {
    device_args.assign(stack->begin() + static_cast<std::ptrdiff_t>(begin), stack->end());
  }
  bool saw_tpu = false;
  bool saw_tpu_device_arg = false;
  bool saw_tpu_generator = false;
  bool saw_cpu_generator = false;
  const std::string* cpu_arg = nullptr;

  // Takes the device tensor (the map keeps it alive while its alias is in use).
  auto convert = [&](at::Tensor t, const c10::Argument& arg, bool allow_cpu) -> at::Tensor {
    if (!t.defined()) {
      return t;
    }
    if (t.device().type() == kTpu) {
      saw_tpu = true;
      if (t.device().index() != device && !cross_device_ok) {
        mixed_device_error(schema.name(), arg.name(), device, t.device().str());
      }
      return aliases.to_cpu_owned(std::move(t));
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
      iv = convert(std::move(iv).toTensor(), arg, false);
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
    mixed_device_error(schema.name(), *cpu_arg, device, "cpu");
  }

  check_gaps_before(op, stack, begin);
  if (executable != 0 && (saw_tpu || saw_tpu_device_arg)) {
    record_executable(executable, op.operator_name().name);
  }
  if (rule != nullptr && rule->before != nullptr) {
    rule->before(op, stack, begin, device_args);
  }
  if (rule == nullptr || rule->instead == nullptr || !rule->instead(op, stack, begin)) {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }

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
