// TPU numerics for the ops that run on the MXU: float32 matmuls and convolutions follow
// TorchTPU's matmul precision (scaled-dot-product attention, which computes in bfloat16: attention.cpp).
//
// The evidence and the exact rules are in hf_tpu/emulator/numerics.py (its docstring); the
// compiled path applies the same rules to the graph there. In short:
//   DEFAULT (torch "medium", TorchTPU's default): operands rounded to bfloat16, products
//     accumulated in float32 (one MXU pass).
//   HIGH ("high", bf16_3x): a*b ~ a_hi*b_hi + a_hi*b_lo + a_lo*b_hi, with a_hi = bf16(a),
//     a_lo = bf16(a - a_hi); computed as one float32 matmul over operands concatenated along
//     the contracting dimension ([a_hi, a_lo] . [b_hi + b_lo; b_hi]).
//   HIGHEST ("highest"): float32 (the CPU kernel as is).
// bf16/fp16 operands are left to the CPU kernels, which accumulate in float32 as the MXU does.
#include "aten/numerics.h"
#include "aten/attention.h"
#include "aten/fallback.h"
#include "aten/tensors.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "tpu/gaps.h"

#include <ATen/Parallel.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace hf_tpu {
namespace {

std::atomic<int> g_precision{0};
std::atomic<bool> g_numerics{true};

// The rounding loop, compiled once per instruction set and picked when the core loads: every float32 matmul
// of decode rounds its activation.
__attribute__((target_clones("avx512f", "avx2", "default"), optimize("O3"))) void round_span(const uint32_t* src,
                                                                                             uint32_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = bf16_rounded_bits(src[i]);
  }
}

at::Tensor round_dense(const at::Tensor& x) {
  // Same strides, so a dense layout maps element i of one buffer to element i of the other.
  at::Tensor out = at::empty_strided(x.sizes(), x.strides(), x.options());
  const auto* src = reinterpret_cast<const uint32_t*>(x.const_data_ptr<float>());
  auto* dst = reinterpret_cast<uint32_t*>(out.mutable_data_ptr<float>());
  // Dense tensors with any strides occupy one block of numel elements starting at the
  // lowest-addressed element; find it.
  int64_t min_offset = 0;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (x.stride(d) < 0) {
      min_offset += (x.size(d) - 1) * x.stride(d);
    }
  }
  src += min_offset;
  dst += min_offset;
  at::parallel_for(0, x.numel(), 65536, [&](int64_t lo, int64_t hi) { round_span(src + lo, dst + lo, hi - lo); });
  return out;
}

at::Tensor high_pass(const at::Tensor& hi, const at::Tensor& x) {
  return round_to_bf16(x - hi);
}

// ---- weights: rounded once, not on every call ------------------------------
// A decode step multiplies every weight again; rounding each one on every call would cost a pass over
// all the model's weights per token. Operands whose root is a leaf that requires grad (parameters,
// also under no_grad) are kept rounded, keyed by storage, geometry and the tensor's version counter
// (an in-place update, e.g. an optimizer step, bumps it), in host memory up to a byte budget (LRU).
constexpr size_t kCacheBudget = size_t{1} << 30;

struct CacheKey {
  const c10::StorageImpl* storage;
  int64_t offset;
  c10::SmallVector<int64_t, 8> geometry;  // sizes, then strides (no heap allocation up to 4-d)
  int kind;                       // which transform (see Transform)
  bool operator==(const CacheKey& o) const {
    return storage == o.storage && offset == o.offset && kind == o.kind && geometry == o.geometry;
  }
};
struct CacheKeyHash {
  size_t operator()(const CacheKey& k) const {
    size_t h = std::hash<const void*>()(k.storage) ^ (std::hash<int64_t>()(k.offset) * 31) ^ (k.kind * 1000003);
    for (int64_t g : k.geometry) {
      h = h * 131 + std::hash<int64_t>()(g);
    }
    return h;
  }
};
struct CacheEntry {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  uint32_t version;
  at::Tensor value;
  uint64_t last_use;
};

std::mutex g_cache_mutex;
std::unordered_map<CacheKey, CacheEntry, CacheKeyHash> g_cache;
size_t g_cache_bytes = 0;
uint64_t g_cache_clock = 0;

size_t bytes_of(const at::Tensor& t) {
  return t.storage().nbytes();
}

void evict_locked(size_t needed) {
  for (auto it = g_cache.begin(); it != g_cache.end();) {  // entries whose weight died
    if (it->second.storage.expired()) {
      g_cache_bytes -= bytes_of(it->second.value);
      it = g_cache.erase(it);
    } else {
      ++it;
    }
  }
  while (!g_cache.empty() && g_cache_bytes + needed > kCacheBudget) {
    auto oldest = g_cache.begin();
    for (auto it = g_cache.begin(); it != g_cache.end(); ++it) {
      if (it->second.last_use < oldest->second.last_use) {
        oldest = it;
      }
    }
    g_cache_bytes -= bytes_of(oldest->second.value);
    g_cache.erase(oldest);
  }
}

bool is_weight(const at::Tensor& device_tensor) {
  if (!device_tensor.defined() || device_tensor.device().type() != kTpu) {
    return false;
  }
  if (device_tensor.is_view()) {
    const at::TensorBase& root = device_tensor._base();
    return root.requires_grad() && root.is_leaf();
  }
  return device_tensor.requires_grad() && device_tensor.is_leaf();
}

// `make()` computed once per weight version (for `kind`), or every time for other operands.
template <typename Make>
at::Tensor transformed(const at::Tensor& t, int kind, Make make) {
  if (!is_weight(t)) {
    return make();
  }
  CacheKey key{t.storage().unsafeGetStorageImpl(), t.storage_offset(), {}, kind};
  key.geometry.reserve(2 * static_cast<size_t>(t.dim()));
  key.geometry.insert(key.geometry.end(), t.sizes().begin(), t.sizes().end());
  key.geometry.insert(key.geometry.end(), t.strides().begin(), t.strides().end());
  const uint32_t version = t._version();
  {
    std::lock_guard<std::mutex> lock(g_cache_mutex);
    auto it = g_cache.find(key);
    if (it != g_cache.end()) {
      auto alive = it->second.storage.lock();
      if (alive.get() == key.storage && it->second.version == version) {
        it->second.last_use = ++g_cache_clock;
        return it->second.value;
      }
      g_cache_bytes -= bytes_of(it->second.value);
      g_cache.erase(it);
    }
  }
  at::Tensor value = make();
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  const size_t nbytes = bytes_of(value);
  if (nbytes <= kCacheBudget / 4) {
    evict_locked(nbytes);
    g_cache.insert_or_assign(key, CacheEntry{c10::weak_intrusive_ptr<c10::StorageImpl>(t.storage().getWeakStorageImpl()),
                                             version, value, ++g_cache_clock});
    g_cache_bytes += nbytes;
  }
  return value;
}

template <typename Make>
at::Tensor transformed(const c10::IValue& device_arg, int kind, Make make) {
  if (!device_arg.isTensor()) {
    return make();
  }
  return transformed(device_arg.toTensor(), kind, make);
}

// The transforms an operand may get (cache kinds).
enum Transform : int { kRound = 0, kHighLeft = 1, kHighRightMatrix = 2, kHighRightVector = 3, kHighConvWeight = 4 };

at::Tensor high_left(const at::Tensor& a) {  // [a_hi, a_lo] along the last (contracting) dimension
  const at::Tensor hi = round_to_bf16(a);
  return at::cat({hi, high_pass(hi, a)}, -1);
}

at::Tensor high_right(const at::Tensor& b, int64_t dim) {  // [b_hi + b_lo; b_hi] along the contracting dimension
  const at::Tensor hi = round_to_bf16(b);
  return at::cat({hi + high_pass(hi, b), hi}, dim);
}

// ---- matmul family -------------------------------------------------------
struct Operands {
  int a;
  int b;
};

const std::unordered_map<std::string, Operands>& matmul_ops() {
  static const std::unordered_map<std::string, Operands> ops = {
      {"aten::mm", {0, 1}},      {"aten::bmm", {0, 1}},     {"aten::addmm", {1, 2}},   {"aten::baddbmm", {1, 2}},
      {"aten::addbmm", {1, 2}},  {"aten::mv", {0, 1}},      {"aten::addmv", {1, 2}},   {"aten::dot", {0, 1}},
      {"aten::_grouped_mm", {0, 1}},
  };
  return ops;
}

void matmul_before(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t begin,
                   const std::vector<c10::IValue>& device_args) {
  const Operands ops = matmul_ops().at(op.operator_name().name);
  c10::IValue& ia = (*stack)[begin + ops.a];
  c10::IValue& ib = (*stack)[begin + ops.b];
  if (!is_f32(ia) || !is_f32(ib)) {
    return;
  }
  at::Tensor a = ia.toTensor();
  at::Tensor b = ib.toTensor();
  // _grouped_mm at HIGH: its offsets may split the contracting dimension, so the one-matmul
  // form does not apply; it runs as DEFAULT (documented in numerics.py).
  tpu_matmul_operands(device_args[ops.a].toTensor(), device_args[ops.b].toTensor(), a, b,
                      /*split_contraction=*/op.operator_name().name != "aten::_grouped_mm");
  ia = std::move(a);
  ib = std::move(b);
}

// ---- convolutions --------------------------------------------------------
// convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
void convolution_before(const c10::OperatorHandle& /*op*/, torch::jit::Stack* stack, size_t begin,
                        const std::vector<c10::IValue>& device_args) {
  if (!g_numerics.load(std::memory_order_relaxed)) {
    return;
  }
  const int precision = g_precision.load(std::memory_order_relaxed);
  c10::IValue& ix = (*stack)[begin + 0];
  c10::IValue& iw = (*stack)[begin + 1];
  if (precision >= 2 || !is_f32(ix) || !is_f32(iw)) {
    return;
  }
  const at::Tensor x = ix.toTensor();
  const at::Tensor w = iw.toTensor();
  if (precision == 0) {
    ix = transformed(device_args[0], kRound, [&] { return round_to_bf16(x); });
    iw = transformed(device_args[1], kRound, [&] { return round_to_bf16(w); });
    return;
  }
  const at::Tensor x_hi = round_to_bf16(x);
  // HIGH: concatenate along the contracting (input-channel) dimension, group by group.
  const bool transposed = (*stack)[begin + 6].toBool();
  const int64_t groups = (*stack)[begin + 8].toInt();
  const int64_t c = x.size(1) / groups;
  const at::Tensor x_lo = high_pass(x_hi, x);
  ix = at::cat({x_hi.unflatten(1, {groups, c}), x_lo.unflatten(1, {groups, c})}, 2).flatten(1, 2);
  // The weight's transform depends on its layout and grouping, so both are part of the cache kind.
  const int kind = kHighConvWeight + 16 * (static_cast<int>(groups) * 2 + (transposed ? 1 : 0));
  iw = transformed(device_args[1], kind, [&] {
    const at::Tensor w_hi = round_to_bf16(w);
    const at::Tensor w16 = w_hi + high_pass(w_hi, w);
    if (transposed) {  // weight (C_in, C_out / groups, ...): contracting over dim 0
      return at::cat({w16.unflatten(0, {groups, c}), w_hi.unflatten(0, {groups, c})}, 1).flatten(0, 1);
    }
    return at::cat({w16, w_hi}, 1);  // weight (C_out, C_in / groups, ...)
  });
}

// convolution_backward(grad_output, input, weight, ...): DEFAULT rounds the three operands;
// HIGH and HIGHEST run in float32 (documented in numerics.py).
void convolution_backward_before(const c10::OperatorHandle& /*op*/, torch::jit::Stack* stack, size_t begin,
                                 const std::vector<c10::IValue>& device_args) {
  if (!g_numerics.load(std::memory_order_relaxed) || g_precision.load(std::memory_order_relaxed) != 0) {
    return;
  }
  for (int i = 0; i < 3; ++i) {
    c10::IValue& iv = (*stack)[begin + i];
    if (is_f32(iv)) {
      const at::Tensor t = iv.toTensor();
      iv = transformed(device_args[i], kRound, [&] { return round_to_bf16(t); });
    }
  }
}

// ---- determinism ---------------------------------------------------------
// A chip runs one XLA program the same way every time; CPU's index_put_ with accumulate=True adds float values
// with atomics from several threads (torch's cpu_atomic_add_float), so equal indices sum in a different order on
// every run. Run it as torch runs it under deterministic algorithms (sorted, sequential accumulation). The flag is
// torch's global (at::Context has no thread-local one): set for this kernel's duration, restored after.
struct DeterministicScope {
  bool was, warn_only, fill;
  DeterministicScope() {
    auto& ctx = at::globalContext();
    was = ctx.deterministicAlgorithms();
    warn_only = ctx.deterministicAlgorithmsWarnOnly();
    fill = ctx.deterministicFillUninitializedMemory();
    ctx.setDeterministicFillUninitializedMemory(false);
    ctx.setDeterministicAlgorithms(true, /*warn_only=*/true);
  }
  ~DeterministicScope() {
    auto& ctx = at::globalContext();
    ctx.setDeterministicAlgorithms(was, warn_only);
    ctx.setDeterministicFillUninitializedMemory(fill);
  }
};

bool accumulate_deterministically(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t begin) {
  const auto& args = op.schema().arguments();
  bool accumulate = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name() == "accumulate") {
      accumulate = (*stack)[begin + i].toBool();
    }
  }
  if (!accumulate || at::globalContext().deterministicAlgorithms()) {
    return false;  // the plain CPU kernel
  }
  DeterministicScope scope;
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  return true;
}

const OpRule kDeterministicAccumulateRule{nullptr, nullptr, &accumulate_deterministically};
const OpRule kMatmulRule{&matmul_before, nullptr};
const OpRule kConvolutionRule{&convolution_before, nullptr};
const OpRule kConvolutionBackwardRule{&convolution_backward_before, nullptr};

template <const OpRule* Rule>
void kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_on_cpu(op, stack, Rule);
}

at::Tensor round_to_bf16_meta(const at::Tensor& x) {
  return at::empty_like(x);
}

}  // namespace

void set_matmul_precision(int precision) {
  TORCH_CHECK(precision >= 0 && precision <= 2, "matmul precision must be 0 (DEFAULT), 1 (HIGH) or 2 (HIGHEST)");
  g_precision = precision;
}
int matmul_precision() {
  return g_precision.load();
}
void set_tpu_numerics(bool enabled) {
  g_numerics = enabled;
}
bool tpu_numerics() {
  return g_numerics.load();
}

at::Tensor round_to_bf16(const at::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "round_to_bf16 expects float32, got ", x.scalar_type());
  TORCH_CHECK(x.device().is_cpu(), "round_to_bf16 expects a CPU tensor");
  if (x.numel() == 0) {
    return x.clone();
  }
  return round_dense(x.is_non_overlapping_and_dense() ? x : x.contiguous());
}

at::Tensor rounded_operand(const at::Tensor& t) {
  if (t.device().type() != kTpu) {
    return round_to_bf16(t);
  }
  return transformed(c10::IValue(t), kRound, [&] { return round_to_bf16(cpu_alias(t)); });
}

void tpu_matmul_operands(const at::Tensor& device_a, const at::Tensor& device_b, at::Tensor& a, at::Tensor& b,
                         bool split_contraction) {
  if (!g_numerics.load(std::memory_order_relaxed) || a.scalar_type() != at::kFloat || b.scalar_type() != at::kFloat) {
    return;
  }
  const int precision = g_precision.load(std::memory_order_relaxed);
  if (precision >= 2) {
    return;
  }
  const at::Tensor a32 = a;
  const at::Tensor b32 = b;
  if (precision == 0 || !split_contraction) {
    a = transformed(device_a, kRound, [&] { return round_to_bf16(a32); });
    b = transformed(device_b, kRound, [&] { return round_to_bf16(b32); });
    return;
  }
  const bool vector = b32.dim() == 1;
  a = transformed(device_a, kHighLeft, [&] { return high_left(a32); });
  b = transformed(device_b, vector ? kHighRightVector : kHighRightMatrix,
                  [&] { return high_right(b32, vector ? -1 : -2); });
}

namespace {
// The ops with a rule of their own (the matmul family's is matmul_ops()), each with its kernel's maker.
const std::unordered_map<std::string, torch::CppFunction (*)()>& rule_kernels() {
  static const std::unordered_map<std::string, torch::CppFunction (*)()> rules = {
      {"aten::convolution", [] { return torch::CppFunction::makeFromBoxedFunction<&kernel<&kConvolutionRule>>(); }},
      {"aten::convolution_backward",
       [] { return torch::CppFunction::makeFromBoxedFunction<&kernel<&kConvolutionBackwardRule>>(); }},
      {"aten::_scaled_dot_product_flash_attention_for_cpu",
       [] { return torch::CppFunction::makeFromBoxedFunction<&attention_kernel>(); }},
      {"aten::_scaled_dot_product_flash_attention_for_cpu_backward",
       [] { return torch::CppFunction::makeFromBoxedFunction<&attention_backward_kernel>(); }},
      {"aten::_index_put_impl_",
       [] { return torch::CppFunction::makeFromBoxedFunction<&kernel<&kDeterministicAccumulateRule>>(); }},
      {"aten::index_put_",
       [] { return torch::CppFunction::makeFromBoxedFunction<&kernel<&kDeterministicAccumulateRule>>(); }},
      {"aten::index_put",
       [] { return torch::CppFunction::makeFromBoxedFunction<&kernel<&kDeterministicAccumulateRule>>(); }},
  };
  return rules;
}
}  // namespace

bool has_numerics_rule(const std::string& name) {
  return matmul_ops().count(name) > 0 || rule_kernels().count(name) > 0;
}

// Every overload of each op gets its rule (functional, out=, in-place, dtype variants).
void register_numerics_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    const std::vector<std::string> unboxed = register_unboxed_kernels();
    // Leaked on purpose: a Library destroyed at exit would deregister kernels torch may still call.
    auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    const auto& rules = rule_kernels();
    for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
      torch::CppFunction (*make)() = nullptr;
      if (matmul_ops().count(name.name) > 0) {
        make = [] { return torch::CppFunction::makeFromBoxedFunction<&kernel<&kMatmulRule>>(); };
      } else if (auto it = rules.find(name.name); it != rules.end()) {
        make = it->second;
      }
      if (make == nullptr) {
        continue;
      }
      const std::string qualified = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
      if (std::find(unboxed.begin(), unboxed.end(), qualified) != unboxed.end()) {
        continue;  // the unboxed kernel applies the same rule
      }
      lib->impl(qualified.c_str(), make());
    }
  });
}

}  // namespace hf_tpu

// The rounding as an op, so compiled graphs use the very same kernel (and Inductor cannot fold
// the float->bfloat16->float round trip away).
TORCH_LIBRARY(hf_tpu_emulator, m) {
  m.def("round_to_bf16(Tensor x) -> Tensor");
}
TORCH_LIBRARY_IMPL(hf_tpu_emulator, CPU, m) {
  m.impl("round_to_bf16", TORCH_FN(hf_tpu::round_to_bf16));
}
TORCH_LIBRARY_IMPL(hf_tpu_emulator, Meta, m) {
  m.impl("round_to_bf16", TORCH_FN(hf_tpu::round_to_bf16_meta));
}
