// Device guard, PrivateUse1 hooks and the generator: what torch.accelerator and
// autograd ask of a device. One chip per process, index 0, as on TorchTPU.
#include "tpu_core.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/CPUAllocator.h>

#include <chrono>

namespace hf_tpu {
namespace {

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(
      index <= 0, "Cannot set TPU device to index ", static_cast<int>(index),
      ", current process is bound to device index 0 (one chip per process, as on TorchTPU; launch one "
      "process per chip, e.g. with `hf-tpu launch -n N` or torchrun).");
}

// ---- generator -------------------------------------------------------------
// Wraps a CPU Philox/MT generator so CPU kernels can draw from it (they check the
// generator's type); the fallback swaps the wrapper for the wrapped generator.
struct TpuGeneratorImpl final : public c10::GeneratorImpl {
  explicit TpuGeneratorImpl(c10::DeviceIndex index = 0)
      : c10::GeneratorImpl(c10::Device(kTpu, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        cpu_(at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val)) {}

  void set_current_seed(uint64_t seed) override {
    cpu_.set_current_seed(seed);
  }
  void set_offset(uint64_t offset) override {
    cpu_.set_offset(offset);
  }
  uint64_t get_offset() const override {
    return cpu_.get_offset();
  }
  uint64_t current_seed() const override {
    return cpu_.current_seed();
  }
  uint64_t seed() override {
    return cpu_.seed();
  }
  void set_state(const c10::TensorImpl& new_state) override {
    cpu_.unsafeGetGeneratorImpl()->set_state(new_state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    return cpu_.unsafeGetGeneratorImpl()->get_state();
  }
  TpuGeneratorImpl* clone_impl() const override {
    auto* copy = new TpuGeneratorImpl(device_.index());
    copy->cpu_ = cpu_.clone();
    return copy;
  }

  at::Generator cpu_;
};

// ---- guard -----------------------------------------------------------------
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
  c10::Device exchangeDevice(c10::Device d) const override {
    check_index(d.index());
    return {kTpu, 0};
  }
  c10::Device getDevice() const override {
    return {kTpu, 0};
  }
  void setDevice(c10::Device d) const override {
    check_index(d.index());
  }
  void uncheckedSetDevice(c10::Device /*d*/) const noexcept override {}
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
    return 1;
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

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

// ---- hooks -----------------------------------------------------------------
struct TpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return true;
  }
  bool hasPrimaryContext(c10::DeviceIndex /*device_index*/) const override {
    return true;
  }
  c10::DeviceIndex deviceCount() const override {
    return 1;
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    check_index(device);
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return 0;
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    check_index(device);
    return 0;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    check_index(device_index);
    return default_generator();
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    check_index(device_index);
    return at::make_generator<TpuGeneratorImpl>(0);
  }
  at::Device getDeviceFromPtr(void* /*data*/) const override {
    return {kTpu, 0};
  }
  bool isPinnedPtr(const void* /*data*/) const override {
    return false;
  }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return c10::GetCPUAllocator();
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
    c10::DataPtr fresh = device_allocator()->allocate(newsize);
    const size_t keep = std::min(newsize, impl->nbytes());
    if (keep > 0) {
      std::memcpy(fresh.get(), impl->data_ptr().get(), keep);
    }
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

struct RegisterHooks {
  RegisterHooks() {
    static TpuHooks hooks;
    at::RegisterPrivateUse1HooksInterface(&hooks);
  }
} g_register_hooks;

}  // namespace

const at::Generator& default_generator() {
  static at::Generator generator = at::make_generator<TpuGeneratorImpl>(0);
  return generator;
}

bool is_tpu_generator(const at::Generator& generator) {
  return generator.defined() && generator.device().type() == kTpu;
}

at::Generator cpu_generator_of(const at::Generator& tpu_generator) {
  return static_cast<TpuGeneratorImpl*>(tpu_generator.unsafeGetGeneratorImpl())->cpu_;
}

}  // namespace hf_tpu
