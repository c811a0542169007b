// A chip's numerics for scaled-dot-product attention (bfloat16 whatever the precision).
#pragma once

#include "core.h"

namespace hf_tpu {

// The kernels of _scaled_dot_product_flash_attention_for_cpu and its backward: TPU attention numerics.
void attention_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void attention_backward_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace hf_tpu
