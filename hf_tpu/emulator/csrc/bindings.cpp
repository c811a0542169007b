// Python surface of the core (`hf_tpu.emulator._C`): capacity, counters, the transfer
// tracker hook and the CPU-alias helpers the compile backend needs.
#include "tpu_core.h"

#include <torch/csrc/Generator.h>
#include <torch/extension.h>

#include <array>
#include <mutex>
#include <thread>

namespace hf_tpu {

std::vector<std::string> route_composites_to_cpu();
void register_numerics_kernels();

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

}  // namespace hf_tpu

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace hf_tpu;
  m.doc() = "Core of the hf-tpu emulated TPU (CPU-backed PrivateUse1 device).";
  m.def("register_kernels", [] {
    register_numerics_kernels();  // registers the unboxed kernels first
    return route_composites_to_cpu();
  }, "Register the numerics kernels, the unboxed kernels of the hottest ops, then the fallback for composite "
     "ops that must run their CPU kernel; returns the names of the latter.");
  m.def("unboxed_ops", &register_unboxed_kernels, "The ops with an unboxed kernel (registered by register_kernels).");
  m.def("default_generator", [](int64_t index) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(default_generator(static_cast<c10::DeviceIndex>(index))));
  }, "Device `index`'s default torch.Generator (one object per device and process).", py::arg("index") = 0);
  m.def("set_device_counts", &set_device_counts, py::arg("usable"), py::arg("reported"),
        "Chips this process can use (tpu:0..usable-1) and what device_count() reports.");
  m.def("set_device_locks", &set_device_locks, py::arg("paths"), py::arg("labels"),
        "One lock file per local device, taken when the chip is first used (empty: none).");
  m.def("device_counts", [] {
    rebind_if_forked();
    return std::make_pair(usable_device_count(), reported_device_count());
  }, "(usable, reported) chips of this process (a forked child binds to its chip first).");
  m.def("any_device_opened", &any_device_opened, "Whether this process has opened a chip yet.");
  m.def("mark_forked", &mark_forked, "Arm the rebind hook: it runs on this (forked) process's first device use.");
  m.def("set_rebind_hook", [](py::function fn) {
    auto* held = new py::object(std::move(fn));  // leaked on purpose: must outlive Python's finalisation
    set_rebind_hook([held] {
      if (!Py_IsInitialized()) {
        return;
      }
      py::gil_scoped_acquire gil;
      try {
        (*held)();
      } catch (py::error_already_set& err) {
        TORCH_CHECK(false, "hf-tpu emulator: binding this forked process to its chip failed: ", err.what());
      }
    });
  }, "Called (once, under the GIL) on a forked child's first device use to re-read its host binding.",
     py::arg("hook"));
  m.def("set_gaps", &set_gaps, py::arg("names"), "TorchTPU gaps the core reproduces (by name).");
  m.def("gap_names", &gap_names, "Names of the gaps the core can reproduce.");
  m.def("set_refused_ops", &set_refused_ops, py::arg("names"),
        "Operators (no overload) that raise TorchTPU's 'not implemented for TPU' error.");
  m.def("set_abort_on_gap", &set_abort_on_gap, py::arg("abort"));
  m.def("set_matmul_precision", &set_matmul_precision, py::arg("precision"));
  m.def("matmul_precision", &matmul_precision);
  m.def("set_tpu_numerics", &set_tpu_numerics, py::arg("enabled"));
  m.def("tpu_numerics", &tpu_numerics);
  m.def("round_to_bf16", &round_to_bf16, py::arg("x"), "float32 CPU tensor rounded to bfloat16, kept in float32.");
  m.def("rounded_operand", &rounded_operand, py::arg("t"),
        "A matmul operand rounded to bfloat16 (CPU tensor); a weight's once per version, as in eager.");
  m.def("set_capacity", &set_capacity, py::arg("nbytes"));
  m.def("capacity", &capacity);
  m.def("take_largest_allocation", &take_largest_allocation,
        "Largest single device allocation in bytes since the previous call (and reset).");
  m.def("counters", [] {
    py::dict out;
    const char* names[] = {"host_to_device", "device_to_host", "syncs"};
    for (int i = 0; i < 3; ++i) {
      auto& c = counter(static_cast<Event>(i));
      out[names[i]] = py::make_tuple(c.count.load(), c.bytes.load());
    }
    return out;
  });
  m.def("executable_stats", [] {
    const ExecutableStats s = executable_stats();
    return py::make_tuple(s.requests, s.hits, s.persisted_hits, s.compilations);
  }, "(requests, hits, persisted hits, compilations) of the eager executable model.");
  m.def("clear_executables", &clear_executables, "Forget the eager executables compiled (the persisted keys stay).");
  m.def("executable_keys", &executable_keys, "The keys of the eager executables this process has.");
  m.def("add_persisted_executables", &add_persisted_executables, py::arg("keys"),
        "Keys a previous process saved: meeting one is a hit, not a compilation.");
  m.def("set_executable_model", &set_executable_model, py::arg("enabled"));
  m.def("executable_log", &executable_log, py::arg("keep_logging"),
        "The op of each eager compilation since the last call; keep_logging turns the log on or off.");
  m.def("release_deferred_storages", &release_deferred_storages,
        "Free the storages other threads left for the main thread (their deleters may need the GIL).");
  m.def("set_tracker", [](py::object fn) {
    std::lock_guard<std::mutex> lock(g_tracker_mutex);
    if (fn.is_none()) {
      g_tracking.store(false, std::memory_order_release);
      delete g_tracker;
      g_tracker = nullptr;
    } else {
      delete g_tracker;
      g_tracker = new py::object(std::move(fn));
      g_tracking.store(true, std::memory_order_release);
    }
  });
  m.def("cpu_alias", [](const at::Tensor& t) {
    TORCH_CHECK(t.device().type() == kTpu, "cpu_alias expects a tpu tensor, got ", t.device());
    return cpu_alias(t);
  }, "A CPU tensor over the same memory as a tpu tensor (no copy).");
  m.def("wrap_cpu", [](const at::Tensor& t, int64_t device) {
    TORCH_CHECK(t.is_cpu(), "wrap_cpu expects a cpu tensor, got ", t.device());
    return wrap_cpu_tensor(t, checked_device_index(static_cast<c10::DeviceIndex>(device)));
  }, "A tpu tensor over the memory of a CPU tensor (no copy; counted as memory of tpu:`device`, -1: current).",
     py::arg("t"), py::arg("device") = -1);
}
