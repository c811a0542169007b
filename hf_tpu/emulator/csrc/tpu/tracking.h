// Transfer and sync counters, and the Python tracker hook (hf_tpu.emulator.track).
#pragma once

#include "core.h"

#include <atomic>

struct _object;  // PyObject

namespace hf_tpu {

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
// The Python tracker that hears each event (hf_tpu.emulator.track), or none (nullptr); the core keeps a reference.
void set_tracker(_object* tracker);

}  // namespace hf_tpu
