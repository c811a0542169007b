// Python surface of the core (`hf_tpu.emulator._C`): capacity, counters, the transfer
// tracker hook and the CPU-alias helpers the compile backend needs.
#include "aten/fallback.h"
#include "aten/numerics.h"
#include "aten/tensors.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/generator.h"
#include "tpu/executables.h"
#include "tpu/gaps.h"
#include "tpu/tracking.h"

#include <torch/csrc/Generator.h>
#include <torch/extension.h>

#include <array>
#include <mutex>
#include <thread>

namespace hf_tpu {

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
  m.def("set_tracker", [](py::object fn) { set_tracker(fn.is_none() ? nullptr : fn.ptr()); });
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
