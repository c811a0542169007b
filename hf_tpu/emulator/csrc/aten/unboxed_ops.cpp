// Unboxed kernels for the ops a decode step runs most (add, mul, cat, rsqrt, mean, silu, ...): the
// fallback's rules (one device per op, CPU tensors only as 0-dim scalars, results adopted as device
// tensors) and the same CPU kernel, without boxing the arguments into a stack and unboxing them again.
// A decode step is a stream of small ops, so the per-op cost is what a user of the emulator feels.
//
// Only ops with no gap check belong here, and no numerics rule but the matmuls' (register_unboxed_kernels
// asserts it).
#include "aten/aliases.h"
#include "aten/fallback.h"
#include "aten/numerics.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "tpu/executables.h"
#include "tpu/gaps.h"

#include <ATen/Operators.h>
#include <torch/library.h>

#include <array>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

namespace hf_tpu {

namespace {

constexpr c10::DispatchKeySet kCpuKeys(c10::DispatchKey::CPU);

// One call's state: the op's device, the CPU aliases, and stable slots for arguments that must be passed
// by reference (a mutable self, a tensor list).
template <class Op>
class Call {
 public:
  // In-place ops here never resize self: the kept alias storages serve.
  explicit Call(c10::DeviceIndex device) : aliases_(device, /*resizable=*/false), device_(device) {}

  // ---- first pass: the op's device is its first tpu tensor's ----
  static void find_device(std::optional<c10::DeviceIndex>& device, const at::Tensor& t) {
    if (!device && t.defined() && t.device().type() == kTpu) {
      device = t.device().index();
    }
  }
  static void find_device(std::optional<c10::DeviceIndex>& device, const std::optional<at::Tensor>& t) {
    if (t.has_value()) {
      find_device(device, *t);
    }
  }
  static void find_device(std::optional<c10::DeviceIndex>& device, const at::ITensorListRef& list) {
    for (const at::Tensor& t : list) {
      find_device(device, t);
    }
  }
  template <class T>
  static void find_device(std::optional<c10::DeviceIndex>& /*device*/, const T& /*other*/) {}

  // ---- second pass: CPU aliases (same rules as the boxed fallback) ----
  at::Tensor to_cpu(const at::Tensor& t, size_t arg) {
    if (!t.defined()) {
      return t;
    }
    if (t.device().type() == kTpu) {
      if (t.device().index() != device_) {
        fail(arg, t.device().str());
      }
      return aliases_.to_cpu(t);
    }
    if (t.is_cpu() && t.dim() > 0) {
      fail(arg, "cpu");
    }
    return t;
  }
  at::Tensor& to_cpu_mutable(const at::Tensor& t, size_t arg) {
    TORCH_INTERNAL_ASSERT(num_mutable_ < mutable_.size());
    at::Tensor& slot = mutable_[num_mutable_++];
    slot = to_cpu(t, arg);
    return slot;
  }
  at::ITensorListRef to_cpu(const at::ITensorListRef& list, size_t arg) {
    TORCH_INTERNAL_ASSERT(list_.empty(), "one tensor list per op");
    for (const at::Tensor& t : list) {
      list_.push_back(to_cpu(t, arg));
    }
    return at::ITensorListRef(list_);
  }
  std::optional<at::Tensor> to_cpu(const std::optional<at::Tensor>& t, size_t arg) {
    return t.has_value() ? std::optional<at::Tensor>(to_cpu(*t, arg)) : std::nullopt;
  }

  at::Tensor to_device(const at::Tensor& out) {
    return aliases_.to_device(out);
  }

 private:
  [[noreturn]] void fail(size_t arg, const std::string& other) const {
    const auto& schema = c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name).schema();
    mixed_device_error(schema.name(), schema.arguments().at(arg).name(), device_, other);
  }

  AliasMap aliases_;
  c10::DeviceIndex device_;
  std::array<at::Tensor, 2> mutable_;
  size_t num_mutable_ = 0;
  c10::SmallVector<at::Tensor, 4> list_;
};

// How each declared argument type reaches the CPU kernel.
template <class T>
struct Pass {
  template <class C>
  static T go(C& /*call*/, T value, size_t /*arg*/) {
    return static_cast<T>(value);
  }
};
template <>
struct Pass<const at::Tensor&> {
  template <class C>
  static at::Tensor go(C& call, const at::Tensor& t, size_t arg) {
    return call.to_cpu(t, arg);
  }
};
template <>
struct Pass<at::Tensor&> {
  template <class C>
  static at::Tensor& go(C& call, const at::Tensor& t, size_t arg) {
    return call.to_cpu_mutable(t, arg);
  }
};
template <>
struct Pass<const at::ITensorListRef&> {
  template <class C>
  static at::ITensorListRef go(C& call, const at::ITensorListRef& list, size_t arg) {
    return call.to_cpu(list, arg);
  }
};
template <>
struct Pass<const std::optional<at::Tensor>&> {
  template <class C>
  static std::optional<at::Tensor> go(C& call, const std::optional<at::Tensor>& t, size_t arg) {
    return call.to_cpu(t, arg);
  }
};

// The matmuls' operands (argument positions) that TPU numerics round; -1: not a matmul.
template <class Op>
constexpr std::pair<int, int> kMatmulOperands{-1, -1};
template <>
constexpr std::pair<int, int> kMatmulOperands<at::_ops::mm>{0, 1};
template <>
constexpr std::pair<int, int> kMatmulOperands<at::_ops::bmm>{0, 1};
template <>
constexpr std::pair<int, int> kMatmulOperands<at::_ops::addmm>{1, 2};
template <>
constexpr std::pair<int, int> kMatmulOperands<at::_ops::baddbmm>{1, 2};

// An argument's part of the executable's key (executables.cpp): shapes and dtypes, scalar values.
template <class T>
void mix_arg(KeyHasher& key, const T& value) {
  using V = std::decay_t<T>;
  if constexpr (std::is_same_v<V, at::Tensor> || std::is_same_v<V, c10::Scalar>) {
    key.mix(value);
  } else if constexpr (std::is_same_v<V, std::optional<at::Tensor>>) {
    value.has_value() ? key.mix(*value) : key.mix(uint64_t{0x9099});
  } else if constexpr (std::is_same_v<V, at::ITensorListRef>) {
    for (const at::Tensor& t : value) {
      key.mix(t);
    }
  } else if constexpr (std::is_same_v<V, at::OptionalIntArrayRef>) {
    if (value.has_value()) {
      for (int64_t v : *value) {
        key.mix(static_cast<uint64_t>(v));
      }
    } else {
      key.mix(uint64_t{0x9099});
    }
  } else if constexpr (std::is_same_v<V, std::optional<at::ScalarType>>) {
    key.mix(value.has_value() ? static_cast<uint64_t>(*value) + 1 : uint64_t{0x9099});
  } else if constexpr (std::is_integral_v<V>) {
    key.mix(static_cast<uint64_t>(value));
  } else {
    static_assert(std::is_integral_v<V>, "mix_arg: add this argument type to the executable key");
  }
}

template <class Op, class Schema = typename Op::schema>
struct Unboxed;

template <class Op, class Ret, class... Args>
struct Unboxed<Op, Ret(Args...)> {
  static_assert(std::is_same_v<Ret, at::Tensor> || std::is_same_v<Ret, at::Tensor&>,
                "unboxed kernels return one tensor (functional) or self (in place)");

  static Ret call(Args... args) {
    return run(std::index_sequence_for<Args...>{}, std::forward<Args>(args)...);
  }

 private:
  template <size_t... I>
  static Ret run(std::index_sequence<I...> /*indices*/, Args... args) {
    static const uint64_t op_key =
        std::hash<std::string>{}(Op::name) ^ (std::hash<std::string>{}(Op::overload_name) << 1);
    KeyHasher key;
    key.mix(op_key);
    (mix_arg(key, args), ...);
    record_executable(key.value == 0 ? 1 : key.value, Op::name);
    std::optional<c10::DeviceIndex> device;
    (Call<Op>::find_device(device, args), ...);
    Call<Op> call(device.has_value() ? *device : current_device());  // the thread-local lookup only when needed
    auto device_args = std::forward_as_tuple(args...);
    // Braced initialisation: converted left to right.
    std::tuple<decltype(Pass<Args>::go(call, std::forward<Args>(args), I))...> cpu_args{
        Pass<Args>::go(call, std::forward<Args>(args), I)...};
    constexpr auto operands = kMatmulOperands<Op>;
    if constexpr (operands.first >= 0) {
      tpu_matmul_operands(std::get<operands.first>(device_args), std::get<operands.second>(device_args),
                          std::get<operands.first>(cpu_args), std::get<operands.second>(cpu_args));
    }
    if constexpr (std::is_same_v<Ret, at::Tensor>) {
      at::Tensor out = std::apply([](auto&... a) { return Op::redispatch(kCpuKeys, a...); }, cpu_args);
      return call.to_device(out);
    } else {
      // In place: the CPU kernel writes through self's alias; the caller gets its own tensor back.
      std::apply([](auto&... a) { Op::redispatch(kCpuKeys, a...); }, cpu_args);
      return std::get<0>(device_args);
    }
  }
};

template <class Op>
void add(torch::Library& lib, std::vector<std::string>& names) {
  const std::string base = Op::name;
  TORCH_INTERNAL_ASSERT(!is_gap_op(base) && (kMatmulOperands<Op>.first >= 0 || !has_numerics_rule(base)), base,
                        " needs the boxed fallback");
  const std::string overload = Op::overload_name;
  const std::string qualified = base.substr(6) + (overload.empty() ? "" : "." + overload);
  lib.impl(qualified.c_str(), torch::CppFunction::makeFromUnboxedFunction(TORCH_FN(Unboxed<Op>::call)));
  names.push_back(qualified);
}

template <class... Ops>
void add_all(torch::Library& lib, std::vector<std::string>& names) {
  (add<Ops>(lib, names), ...);
}

}  // namespace

std::vector<std::string> register_unboxed_kernels() {
  static std::once_flag once;
  static std::vector<std::string> names;
  std::call_once(once, [] {
    // Leaked on purpose: a Library destroyed at exit would deregister kernels torch may still call.
    auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    namespace ops = at::_ops;
    add_all<
        // elementwise arithmetic, functional and in place
        ops::add_Tensor, ops::add__Tensor, ops::add_Scalar, ops::sub_Tensor, ops::sub__Tensor, ops::mul_Tensor, ops::mul__Tensor, ops::mul_Scalar,
        ops::mul__Scalar, ops::div_Tensor, ops::div__Tensor, ops::div_Scalar, ops::div__Scalar, ops::pow_Tensor_Scalar, ops::neg, ops::rsqrt, ops::exp, ops::cos, ops::sin,
        ops::tanh, ops::sigmoid, ops::silu, ops::eq_Scalar, ops::eq_Tensor, ops::where_self, ops::masked_fill_Scalar, ops::masked_fill__Scalar, ops::fill__Scalar,
        // reductions, softmax, joins and gathers
        ops::mean_dim, ops::sum_dim_IntList, ops::_softmax, ops::cat, ops::index_select,
        // matmuls, with TPU numerics (numerics.cpp's rule, unboxed)
        ops::mm, ops::bmm, ops::addmm, ops::baddbmm>(*lib, names);
  });
  return names;
}

}  // namespace hf_tpu
