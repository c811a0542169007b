// TorchTPU's eager executable cache, as a model. TorchTPU runs an eager op by compiling an XLA executable for
// it, keyed by the op, its arguments' shapes and dtypes, and the values of its scalar arguments; a key seen
// before is a cache hit. The emulator runs the CPU kernel either way, but counts what TorchTPU would have
// compiled, so `torch.tpu._get_cache_stats()` answers as on a chip: measured against the real wheel on
// XLA:CPU by bench/compile_counts.py. Keys a previous process saved (TorchTPU's persistent cache, modelled)
// are hits, not compilations.
#include "tpu/executables.h"
#include "aten/fallback.h"
#include "runtime/allocator.h"
#include "runtime/device.h"

#include <mutex>
#include <unordered_set>

namespace hf_tpu {
namespace {

std::mutex g_mutex;                      // guards the sets and counters below; held only to look up and count
std::unordered_set<uint64_t> g_compiled;  // keys compiled (or loaded from the persisted set) in this process
std::unordered_set<uint64_t> g_persisted;  // keys a previous process saved
ExecutableStats g_stats;
std::atomic<bool> g_enabled{true};
std::vector<std::string> g_log;  // the op of each compilation, while logging (executable_log)
bool g_logging = false;

// A tensor argument: dtype, shape and layout. TorchTPU fuses a view into the op that reads it, so a slice at
// another offset is another executable (measured: x[:, 1:5] + 0, then x[:, 2:6] + 0, compiles twice).
void mix_tensor(KeyHasher& h, const at::Tensor& t) {
  if (!t.defined()) {
    h.mix(0x7e57);
    return;
  }
  if (t.device().type() != kTpu && t.dim() == 0) {
    h.mix(0x5ca1);  // a host scalar (a Python number, a 0-dim CPU tensor): passed at run time, as a Scalar
    return;
  }
  h.mix(static_cast<uint64_t>(t.scalar_type()) + 1);
  h.mix(t.device().type() == kTpu ? 1 : 2);
  h.mix(static_cast<uint64_t>(t.dim()));
  for (int64_t s : t.sizes()) {
    h.mix(static_cast<uint64_t>(s));
  }
  if (t.device().type() == kTpu) {
    for (int64_t s : t.strides()) {
      h.mix(static_cast<uint64_t>(s));
    }
    h.mix(static_cast<uint64_t>(t.storage_offset()));
  }
}

// Ops TorchTPU runs as more than one executable (measured on the real wheel, XLA:CPU: x[idx] compiles two).
int executables_per_op(std::string_view op) {
  if (op == "aten::index") {
    return 2;
  }
  return 1;
}

}  // namespace

void KeyHasher::mix(uint64_t v) {
  value ^= v + 0x9e3779b97f4a7c15ULL + (value << 6) + (value >> 2);
}

void KeyHasher::mix(const at::Tensor& t) {
  mix_tensor(*this, t);
}

// A Scalar argument (alpha, a fill value, an exponent): by kind, not value. TorchTPU passes it to the
// executable at run time (measured: x.pow(2) then x.pow(3) compiles once); int arguments (dims, diagonals)
// are part of the program.
void KeyHasher::mix(const c10::Scalar& s) {
  mix(static_cast<uint64_t>(s.type()) + 0x5ca1);
}

void KeyHasher::mix(const c10::IValue& iv) {
  if (iv.isTensor()) {
    mix_tensor(*this, iv.toTensor());
  } else if (iv.isTensorList()) {
    for (const at::Tensor& t : iv.toTensorList()) {
      mix_tensor(*this, t);
    }
  } else if (iv.isOptionalTensorList()) {
    for (const std::optional<at::Tensor>& t : iv.toOptionalTensorList()) {
      t.has_value() ? mix_tensor(*this, *t) : mix(0x9099);
    }
  } else if (iv.isInt()) {
    mix(static_cast<uint64_t>(iv.toInt()));
  } else if (iv.isDouble() || iv.isComplexDouble()) {
    mix(iv.toScalar());
  } else if (iv.isBool()) {
    mix(iv.toBool() ? 3 : 5);
  } else if (iv.isIntList()) {
    for (int64_t v : iv.toIntList()) {
      mix(static_cast<uint64_t>(v));
    }
  } else if (iv.isString()) {
    mix(std::hash<std::string_view>{}(iv.toStringView()));
  } else {
    mix(std::hash<std::string>{}(iv.tagKind()));  // None, devices, generators...: by kind
  }
}

void record_executable(uint64_t key, std::string_view op) {
  if (!g_enabled.load(std::memory_order_relaxed)) {
    return;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  ++g_stats.requests;
  if (g_compiled.insert(key).second) {
    if (g_persisted.count(key) == 0) {
      g_stats.compilations += executables_per_op(op);
      if (g_logging) {
        g_log.emplace_back(op);
      }
    } else {
      ++g_stats.persisted_hits;
    }
  } else {
    ++g_stats.hits;
  }
}

ExecutableStats executable_stats() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_stats;
}

void clear_executables() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_compiled.clear();
  g_stats = ExecutableStats{};
}

std::vector<uint64_t> executable_keys() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return {g_compiled.begin(), g_compiled.end()};
}

void add_persisted_executables(const std::vector<uint64_t>& keys) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_persisted.insert(keys.begin(), keys.end());
}

std::vector<std::string> executable_log(bool keep_logging) {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<std::string> out;
  out.swap(g_log);
  g_logging = keep_logging;
  return out;
}

void set_executable_model(bool enabled) {
  g_enabled.store(enabled, std::memory_order_relaxed);
}

}  // namespace hf_tpu
