// A chip's numerics for matmuls and convolutions (TorchTPU's float32 matmul precision).
#pragma once

#include "core.h"

#include <cstring>
#include <string>

namespace hf_tpu {

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
// Register the numerics rules' kernels (after the unboxed kernels, which they wrap).
void register_numerics_kernels();

}  // namespace hf_tpu
