// TorchTPU's known gaps, reproduced the way a user meets them (the catalogue with evidence and
// TorchTPU versions are the records in hf_tpu/gaps/known/; the profile decides which are on), and the operators it refuses.
//
// Where TorchTPU aborts the process, the emulator raises a RuntimeError saying so, or really
// aborts with HF_TPU_EMULATOR_GAPS=abort (so harness tests can check that an abort is contained).
#include "tpu/gaps.h"
#include "aten/fallback.h"
#include "aten/numerics.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/stack.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <unordered_set>

namespace hf_tpu {
namespace {

constexpr std::array<const char*, static_cast<size_t>(Gap::kCount)> kNames = {
    "cholesky",
    "ctc_loss",
    "weight_tying",
    "fully_masked_attention_row",
    "multinomial_seeding",
    "differentiable_attention_mask",
    "boolean_mask_indexing",
    "interpolate_same_size",
    "attention_precision",
    "device_sharing",
    "record_stream",
};

std::atomic<uint64_t> g_gaps{0};
std::atomic<bool> g_abort{false};

const std::string& base_name(const c10::OperatorHandle& op) {
  return op.operator_name().name;
}

[[noreturn]] void not_implemented(const c10::OperatorHandle& op) {
  // TorchTPU's boxed fallback for ops it has no kernel for: a RuntimeError, in its words (the real wheel, run on
  // XLA:CPU: "operator 'aten::linalg_cholesky_ex.L' is not implemented for TPU. Please file a feature request").
  const auto& name = op.operator_name();
  TORCH_CHECK(false, "operator '", name.name, name.overload_name.empty() ? "" : ".", name.overload_name,
              "' is not implemented for TPU. Please file a feature request");
}

bool is_bool_mask(const at::Tensor& t) {
  return t.defined() && (t.scalar_type() == at::kBool || t.scalar_type() == at::kByte);
}

// x[:, :, mask2d]: TorchTPU broadcasts a multi-dimensional boolean index that follows a slice
// instead of selecting with it.
void check_boolean_mask_index(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t begin) {
  const c10::IValue& indices = (*stack)[begin + 1];
  if (!indices.isOptionalTensorList()) {
    return;
  }
  const auto list = indices.toOptionalTensorList();
  bool after_slice = false;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::optional<at::Tensor> index = list.get(i);
    if (!index.has_value() || !index->defined()) {
      after_slice = true;
      continue;
    }
    if (after_slice && index->dim() >= 2 && is_bool_mask(*index)) {
      const at::Tensor& self = (*stack)[begin].toTensor();
      TORCH_CHECK_INDEX(false, "shape mismatch: indexing tensors could not be broadcast together with shapes ",
                        self.sizes(), ", ", index->sizes(), " (in ", base_name(op), ")");
    }
  }
}

// F.interpolate(x, size=x.shape[-1], mode="linear") aborts on TorchTPU.
void check_interpolate_same_size(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t begin) {
  const at::Tensor& self = (*stack)[begin].toTensor();
  if (self.dim() != 3) {
    return;
  }
  const c10::IValue& size = (*stack)[begin + 1];
  int64_t out = -1;
  if (size.isIntList() && size.toIntList().size() == 1) {
    out = size.toIntList().get(0);
  } else if (op.operator_name().overload_name == "vec") {  // (input, output_size?, align_corners, scale_factors?)
    const c10::IValue& scales = (*stack)[begin + 3];
    if (scales.isDoubleList() && scales.toDoubleList().size() == 1) {
      out = static_cast<int64_t>(std::floor(static_cast<double>(self.size(-1)) * scales.toDoubleList().get(0)));
    }
  }
  if (out == self.size(-1)) {
    gap_abort(Gap::kInterpolateSameSize,
              base_name(op) + " to the size the input already has (" + std::to_string(out) + ")");
  }
}

// torch.multinomial on TorchTPU draws from an unseeded source: replace the generator with a
// freshly (randomly) seeded one for every call.
void unseed_multinomial(torch::jit::Stack* stack, size_t begin, size_t num_args) {
  for (size_t i = begin; i < begin + num_args; ++i) {
    c10::IValue& iv = (*stack)[i];
    if (iv.isGenerator()) {
      static std::random_device entropy;
      iv = at::make_generator<at::CPUGeneratorImpl>((static_cast<uint64_t>(entropy()) << 32) ^ entropy());
    }
  }
}

}  // namespace

bool gap_enabled(Gap gap) {
  return (g_gaps.load(std::memory_order_relaxed) >> static_cast<int>(gap)) & 1U;
}

void set_gaps(const std::vector<std::string>& names) {
  uint64_t mask = 0;
  for (const auto& name : names) {
    bool found = false;
    for (size_t i = 0; i < kNames.size(); ++i) {
      if (name == kNames[i]) {
        mask |= uint64_t{1} << i;
        found = true;
      }
    }
    TORCH_CHECK(found, "hf-tpu emulator: unknown gap ", name);
  }
  g_gaps = mask;
}

std::vector<std::string> gap_names() {
  return {kNames.begin(), kNames.end()};
}

void set_abort_on_gap(bool abort) {
  g_abort = abort;
}

void gap_abort(Gap gap, const std::string& what) {
  const char* name = kNames[static_cast<size_t>(gap)];
  if (g_abort.load()) {
    std::fprintf(stderr, "hf-tpu emulator: TorchTPU aborts the process here (gap '%s'): %s\n", name, what.c_str());
    std::fflush(stderr);
    std::abort();
  }
  TORCH_CHECK(false, "TorchTPU aborts the process here (known gap '", name, "'): ", what,
              ". The emulator raises instead; HF_TPU_EMULATOR_GAPS=abort makes it abort like the chip.");
}

namespace {

// Operators TorchTPU has no kernel for (hf_tpu/emulator/op_coverage/: measured on the real wheel), by name
// without overload: set once, when the profile is installed, before any op runs.
std::unordered_set<std::string> g_refused;

}  // namespace

void set_refused_ops(const std::vector<std::string>& names) {
  g_refused = {names.begin(), names.end()};
}

bool is_gap_op(const std::string& name) {
  static const std::unordered_set<std::string> kGapOps = {
      "aten::linalg_cholesky_ex", "aten::cholesky", "aten::cholesky_inverse", "aten::_ctc_loss",
      "aten::_ctc_loss_backward", "aten::upsample_linear1d", "aten::index", "aten::record_stream",
      "aten::multinomial"};
  return kGapOps.count(name) != 0 || g_refused.count(name) != 0;
}

namespace {

// Called for every op the fallback runs: remember the answer per operator (its name string lives as long
// as the operator) in a small per-thread table instead of hashing the name on every call.
bool is_gap_op_cached(const std::string& name) {
  struct Slot {
    const std::string* key = nullptr;
    bool gap = false;
  };
  thread_local Slot slots[256];
  Slot& slot = slots[(reinterpret_cast<uintptr_t>(&name) >> 4) & 255];
  if (slot.key != &name) {
    slot = {&name, is_gap_op(name)};
  }
  return slot.gap;
}

}  // namespace

void check_gaps_before(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t begin) {
  const std::string& name = base_name(op);
  if (!is_gap_op_cached(name)) {
    return;
  }
  const size_t num_args = op.schema().arguments().size();
  if (g_refused.count(name) != 0) {
    not_implemented(op);
  }
  if (gap_enabled(Gap::kCholesky) &&
      (name == "aten::linalg_cholesky_ex" || name == "aten::cholesky" || name == "aten::cholesky_inverse")) {
    not_implemented(op);
  }
  if (gap_enabled(Gap::kCtcLoss) && (name == "aten::_ctc_loss" || name == "aten::_ctc_loss_backward")) {
    gap_abort(Gap::kCtcLoss, name);
  }
  if (gap_enabled(Gap::kInterpolateSameSize) && name == "aten::upsample_linear1d") {
    check_interpolate_same_size(op, stack, begin);
  }
  if (gap_enabled(Gap::kBooleanMaskIndexing) && name == "aten::index") {
    check_boolean_mask_index(op, stack, begin);
  }
  if (gap_enabled(Gap::kRecordStream) && name == "aten::record_stream") {
    not_implemented(op);
  }
  if (gap_enabled(Gap::kMultinomialSeeding) && name == "aten::multinomial") {
    unseed_multinomial(stack, begin, num_args);
  }
}

}  // namespace hf_tpu
