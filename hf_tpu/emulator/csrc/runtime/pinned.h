// Pinned host memory: plain CPU memory that remembers it was pinned, as TorchTPU's host allocator answers.
#pragma once

#include "core.h"

namespace hf_tpu {

c10::Allocator* pinned_allocator();
bool is_pinned(const void* ptr);

}  // namespace hf_tpu
