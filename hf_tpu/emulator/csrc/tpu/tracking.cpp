// Transfer and sync counters, and the Python tracker hook that hears each event (hf_tpu.emulator.track).
#include "tpu/tracking.h"
#include "runtime/allocator.h"

#include <torch/extension.h>

#include <array>
#include <mutex>
#include <thread>

namespace hf_tpu {
namespace {

std::array<Counter, 3> g_counters;
std::atomic<bool> g_tracking{false};
std::mutex g_tracker_mutex;
py::object* g_tracker = nullptr;  // leaked on purpose: must not be destroyed after Python finalises

}  // namespace

namespace {
const std::thread::id g_main_thread = std::this_thread::get_id();  // the thread that imported the core
}  // namespace

bool on_main_thread() {
  return std::this_thread::get_id() == g_main_thread;
}

static bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

Counter& counter(Event e) {
  return g_counters[static_cast<int>(e)];
}

void record_event(Event e, int64_t nbytes, const char* what) {
  auto& c = counter(e);
  c.count.fetch_add(1, std::memory_order_relaxed);
  c.bytes.fetch_add(nbytes, std::memory_order_relaxed);
  if (e == Event::kDeviceToHost) {  // a device->host copy waits for the device: a sync too
    auto& s = counter(Event::kSync);
    s.count.fetch_add(1, std::memory_order_relaxed);
    s.bytes.fetch_add(nbytes, std::memory_order_relaxed);
  }
  if (!g_tracking.load(std::memory_order_acquire)) {
    return;
  }
  // Only a thread that already holds the GIL reports to the tracker: it has the user's frame, and
  // other threads (autograd's device workers) would have to take the GIL, which ends the thread
  // with std::terminate if the interpreter is finalizing meanwhile. Their events are counted above.
  // Once the interpreter finalizes, a thread that takes the GIL is ended inside this (noexcept) path,
  // which aborts the process: events are then only counted.
  if (Py_IsInitialized() == 0 || python_finalizing()) {
    return;
  }
  py::gil_scoped_acquire gil;
  py::object tracker;
  {
    std::lock_guard<std::mutex> lock(g_tracker_mutex);
    if (g_tracker == nullptr) {
      return;
    }
    tracker = *g_tracker;
  }
  tracker(static_cast<int>(e), nbytes, what);
}

void set_tracker(_object* tracker) {
  std::lock_guard<std::mutex> lock(g_tracker_mutex);
  delete g_tracker;
  g_tracker = nullptr;
  if (tracker == nullptr) {
    g_tracking.store(false, std::memory_order_release);
    return;
  }
  g_tracker = new py::object(py::reinterpret_borrow<py::object>(tracker));
  g_tracking.store(true, std::memory_order_release);
}

}  // namespace hf_tpu
