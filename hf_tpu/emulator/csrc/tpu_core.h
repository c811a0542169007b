// Shared declarations of the emulated TPU core: a CPU-memory-backed PrivateUse1 device.
//
// Layering: allocator.cpp (HBM accounting, chips held) <- runtime.cpp (host model, guard, hooks,
//           generators) <- gaps.cpp (TorchTPU's known gaps, switchable) <- native_ops.cpp
//           (factories, views, copies) <- fallback.cpp (every other op; unboxed_ops.cpp: the hottest ones, unboxed;
//           executables.cpp: the eager executables TorchTPU would compile for them) <- numerics.cpp (TPU
//           numerics of matmuls and convolutions; attention.cpp: of attention) <- bindings.cpp (`hf_tpu.emulator._C`).
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

// ---- allocator.cpp -------------------------------------------------------
// The device allocator: host memory, HBM-style accounting per chip, a capacity per chip.
// Allocations land on the calling thread's current device (see DeviceScope).
c10::DeviceAllocator* device_allocator();
void set_capacity(int64_t bytes);
int64_t capacity();
// Largest single allocation (bytes) since the previous call; resets it.
int64_t take_largest_allocation();
// Adopt a CPU storage's memory as memory of `device` without copying. The returned
// DataPtr keeps the CPU storage alive and counts its bytes as allocated; it
// raises torch.OutOfMemoryError (freeing nothing of the caller's) if the
// capacity would be exceeded.
c10::DataPtr adopt_cpu_storage(const c10::Storage& cpu_storage, c10::DeviceIndex device);
// Make a CPU kernel's fresh output (held only by the caller, memory from torch's CPU allocator) a tensor
// of `device` in place: no new tensor, storage or copy. False (nothing changed) if it is not such an output.
bool take_cpu_output(const at::Tensor& cpu_out, c10::DeviceIndex device);
// A CPU storage over a device storage's memory, made once per allocation (not resizable); undefined
// for memory this allocator does not track (e.g. empty or zero tensors).
c10::Storage cpu_alias_storage(const c10::Storage& device_storage);
// One lock file per local device: a chip is opened (locked) on its first allocation, as
// TorchTPU's runtime opens the chips lazily. Empty paths: no locking.
void set_device_locks(std::vector<std::string> paths, std::vector<std::string> labels);
// Whether this process has opened (locked) any chip yet.
bool any_device_opened();

// ---- runtime.cpp ---------------------------------------------------------
// The host model: `usable` devices tpu:0..usable-1 can hold tensors; device_count()
// reports `reported` (more than usable when TPU_VISIBLE_DEVICES is ignored, as on TorchTPU).
void set_device_counts(int usable, int reported);
// A forked child re-reads its host binding (LOCAL_RANK...) on its first device use, as TorchTPU's runtime
// initialises lazily: mark_forked() arms it, rebind_if_forked() runs `hook` once (under the GIL).
void set_rebind_hook(std::function<void()> hook);
void mark_forked();
void rebind_if_forked();
int usable_device_count();
int reported_device_count();
// The calling thread's current device (the process's own chip unless a guard switched it).
c10::DeviceIndex current_device();
// Throws a clear error unless `index` names a usable device (-1 means "current").
c10::DeviceIndex checked_device_index(c10::DeviceIndex index);
class DeviceScope {
 public:
  explicit DeviceScope(c10::DeviceIndex index);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  c10::DeviceIndex previous_;
};
// Each device's default generator and the CPU generator a tpu generator wraps.
const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator cpu_generator_of(const at::Generator& tpu_generator);
bool is_tpu_generator(const at::Generator& generator);

// ---- gaps.cpp ------------------------------------------------------------
// TorchTPU's known gaps the core reproduces (the Python table in hf_tpu/gaps/__init__.py has the rest).
enum class Gap : int {
  kCholesky = 0,
  kCtcLoss,
  kWeightTying,
  kFullyMaskedAttentionRow,
  kMultinomialSeeding,
  kDifferentiableAttentionMask,
  kBooleanMaskIndexing,
  kInterpolateSameSize,
  kAttentionPrecision,
  kDeviceSharing,
  kRecordStream,
  kCount
};
bool gap_enabled(Gap gap);
// Names as in hf_tpu/gaps/__init__.py; unknown names raise.
void set_gaps(const std::vector<std::string>& names);
std::vector<std::string> gap_names();
// TorchTPU aborts the process at these points: raise a RuntimeError saying so, or really
// abort when HF_TPU_EMULATOR_GAPS=abort (for harness tests).
void set_abort_on_gap(bool abort);
[[noreturn]] void gap_abort(Gap gap, const std::string& what);
// Checks run by the fallback before an op's CPU kernel (cholesky, ctc_loss, interpolate,
// boolean-mask indexing, multinomial); may replace arguments on the stack.
void check_gaps_before(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t begin);
// Whether check_gaps_before has anything to check for the operator ("aten::index", ...).
bool is_gap_op(const std::string& name);
// Operators ("aten::median", no overload) that raise TorchTPU's "not implemented for TPU" error.
void set_refused_ops(const std::vector<std::string>& names);

// ---- native_ops.cpp / fallback.cpp --------------------------------------
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

// An op rule runs around the CPU kernel: `before` may rewrite the CPU arguments on the
// stack (it also sees the caller's original arguments, device tensors included), `after` the
// CPU results. `instead`, after `before`, may compute the op itself: it replaces the arguments on the
// stack with the results and returns true; false lets the CPU kernel run.
struct OpRule {
  void (*before)(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t begin,
                 const std::vector<c10::IValue>& device_args) = nullptr;
  void (*after)(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t begin) = nullptr;
  bool (*instead)(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t begin) = nullptr;
};
// Whether a stack argument is a defined float32 tensor (what the numerics rules apply to).
inline bool is_f32(const c10::IValue& iv) {
  return iv.isTensor() && iv.toTensor().defined() && iv.toTensor().scalar_type() == at::kFloat;
}
// Run `op` on CPU aliases of its device tensors (the boxed fallback), with an optional rule.
void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack, const OpRule* rule);
// unboxed_ops.cpp: register the unboxed kernels (once); their "op.overload" names.
std::vector<std::string> register_unboxed_kernels();

// ---- numerics.cpp --------------------------------------------------------
// TorchTPU's float32 matmul precision: 0 DEFAULT (1 bf16 pass), 1 HIGH (3 passes), 2 HIGHEST.
void set_matmul_precision(int precision);
int matmul_precision();
// A float32 matmul's CPU operands `a`, `b` as the MXU sees them at the current precision (rounded to
// bfloat16, or split for HIGH's 3 passes when `split_contraction`); weights' transforms are kept. The device
// tensors identify weights. No-op for other dtypes, precision HIGHEST, or with TPU numerics off.
void tpu_matmul_operands(const at::Tensor& device_a, const at::Tensor& device_b, at::Tensor& a, at::Tensor& b,
                         bool split_contraction = true);
// Whether the operator ("aten::mm", ...) has a numerics kernel (a rule around its CPU kernel).
bool has_numerics_rule(const std::string& name);
// TPU numerics on/off (the "ideal" profile turns them off: CPU-exact results).
void set_tpu_numerics(bool enabled);
bool tpu_numerics();
// float32 -> nearest bfloat16 (ties to even), kept in float32; NaN stays NaN. CPU tensors.
at::Tensor round_to_bf16(const at::Tensor& x);
// The same for one value's bits: c10::BFloat16's rounding (NaN -> the canonical quiet NaN), so eager equals a
// compiled float->bfloat16->float cast bit for bit; branch-free, so that loops over it vectorise.
inline uint32_t bf16_rounded_bits(uint32_t bits) {
  const uint32_t rounded = (bits + ((bits >> 16) & 1U) + 0x7fffU) & 0xffff0000U;
  return (bits & 0x7fffffffU) > 0x7f800000U ? 0x7fc00000U : rounded;
}
inline float bf16_rounded(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits = bf16_rounded_bits(bits);
  std::memcpy(&x, &bits, sizeof(bits));
  return x;
}

// A matmul operand rounded to bfloat16 as a CPU tensor: a weight's (see is_weight in numerics.cpp)
// computed once per version and kept, as in eager; any other tensor's computed now. For compiled graphs.
at::Tensor rounded_operand(const at::Tensor& t);

// ---- attention.cpp -------------------------------------------------------
// The kernels of _scaled_dot_product_flash_attention_for_cpu and its backward: TPU attention numerics.
void attention_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void attention_backward_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// ---- executables.cpp -----------------------------------------------------
// TorchTPU's eager executable cache, modelled: one executable per op, argument shapes and dtypes, and scalar
// argument values. The fallback and the unboxed kernels record each device op's key.
struct KeyHasher {
  uint64_t value = 0xcbf29ce484222325ULL;
  void mix(uint64_t v);
  void mix(const at::Tensor& t);
  void mix(const c10::Scalar& s);
  void mix(const c10::IValue& iv);
};
struct ExecutableStats {
  int64_t requests = 0;
  int64_t hits = 0;            // keys this process compiled before
  int64_t persisted_hits = 0;  // keys a previous process saved (TorchTPU's persistent cache)
  int64_t compilations = 0;
};
// `op`: the operator's name ("aten::add"), for the ops TorchTPU runs as several executables.
void record_executable(uint64_t key, std::string_view op);
ExecutableStats executable_stats();
void clear_executables();
std::vector<uint64_t> executable_keys();
void add_persisted_executables(const std::vector<uint64_t>& keys);
void set_executable_model(bool enabled);
// The ops of the compilations since the last call (while logging); `keep_logging` turns logging on or off.
std::vector<std::string> executable_log(bool keep_logging);

// ---- transfer and sync counters (bindings.cpp) --------------------------
enum class Event : int { kHostToDevice = 0, kDeviceToHost = 1, kSync = 2 };
struct Counter {
  std::atomic<int64_t> count{0};
  std::atomic<int64_t> bytes{0};
};
Counter& counter(Event e);
// Called on each event; forwards to the Python tracker when one is active.
void record_event(Event e, int64_t nbytes, const char* what);

// Whether this is the thread that imported the core (Python's main thread): the one thread the
// interpreter's finalization never ends. Any other thread that takes the GIL while it finalizes is
// ended inside a noexcept destructor, which aborts the process.
bool on_main_thread();
// Storages whose memory Python may own (DLPack, NumPy), freed on another thread (autograd's device
// workers), wait here for the main thread: its next allocation, or exit.
void release_deferred_storages();

}  // namespace hf_tpu
