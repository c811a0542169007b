// torch's device guard for the device (c10::impl::DeviceGuardImplInterface): current device, streams, events.
// Streams and events exist and record host time; every op completes before the next.
#include "runtime/device.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <chrono>

namespace hf_tpu {
namespace {

thread_local c10::StreamId t_current_stream = 0;
std::atomic<c10::StreamId> g_next_stream{1};

struct TpuEvent {
  std::chrono::steady_clock::time_point time;
  bool timing;
};

struct TpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kTpu;
  }
  // Device guards (ops on tpu:N, torch.accelerator.device_index) switch the thread's device;
  // an explicit set_device to another chip is refused, as on TorchTPU.
  c10::Device exchangeDevice(c10::Device d) const override {
    return {kTpu, exchange_current_device(d.index())};
  }
  c10::Device getDevice() const override {
    return {kTpu, current_device()};
  }
  void setDevice(c10::Device d) const override {
    check_bound(d.index());
    set_current_device_unchecked(0);
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    set_current_device_unchecked(d.index() < 0 ? 0 : d.index());
  }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kTpu, d.index() < 0 ? 0 : d.index()), t_current_stream);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kTpu, d.index() < 0 ? 0 : d.index()), 0);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*isHighPriority*/) const override {
    return getNewStream(d, 0);
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kTpu, d.index() < 0 ? 0 : d.index()), g_next_stream++);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto previous = getStream(s.device());
    t_current_stream = s.id();
    return previous;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      rebind_if_forked();
    } catch (...) {  // noexcept here: the next device use reports the error
    }
    return static_cast<c10::DeviceIndex>(reported_device_count());
  }
  void record(void** event, const c10::Stream& /*stream*/, const c10::DeviceIndex /*device_index*/,
              const c10::EventFlag flag) const override {
    if (*event == nullptr) {
      *event = new TpuEvent{};
    }
    auto* e = static_cast<TpuEvent*>(*event);
    e->time = std::chrono::steady_clock::now();
    e->timing = flag == c10::EventFlag::BACKEND_DEFAULT;
  }
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override {
    return true;  // the emulator runs every op synchronously
  }
  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<TpuEvent*>(event);
  }
  bool queryStream(const c10::Stream& /*stream*/) const override {
    return true;
  }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {}
  void synchronizeEvent(void* /*event*/) const override {}
  void synchronizeDevice(const c10::DeviceIndex /*device_index*/) const override {}
  void recordDataPtrOnStream(const c10::DataPtr& /*data_ptr*/, const c10::Stream& /*stream*/) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(start != nullptr && end != nullptr, "Both events must be recorded before calling elapsed_time.");
    auto* a = static_cast<TpuEvent*>(start);
    auto* b = static_cast<TpuEvent*>(end);
    TORCH_CHECK(a->timing && b->timing, "elapsed_time requires both events to be created with enable_timing=True.");
    return std::chrono::duration<double, std::milli>(b->time - a->time).count();
  }
};

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

}  // namespace hf_tpu
