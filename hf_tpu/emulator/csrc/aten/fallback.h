// The boxed fallback: every op without a native kernel runs its CPU kernel on CPU aliases of its device tensors.
#pragma once

#include "core.h"

#include <string>
#include <vector>

namespace hf_tpu {

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
// Route the ops whose composite kernel would win over the fallback to their CPU kernels; their names.
std::vector<std::string> route_composites_to_cpu();

}  // namespace hf_tpu
