// TorchTPU's eager executable cache, modelled: what a chip would compile for each eager op.
#pragma once

#include "core.h"

#include <string>
#include <string_view>
#include <vector>

namespace hf_tpu {

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

}  // namespace hf_tpu
