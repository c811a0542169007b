// TorchTPU's known gaps the core reproduces, switched on by the profile (hf_tpu/emulator/gaps.py).
#pragma once

#include "core.h"

#include <string>
#include <vector>

namespace hf_tpu {

// TorchTPU's known gaps the core reproduces (their records, in hf_tpu/gaps/known/, say emulation="core"; the rest are in Python).
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
// Names as the records name them (hf_tpu/gaps/known/<name>.py); unknown names raise.
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

}  // namespace hf_tpu
