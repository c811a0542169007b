// The host model, device guard, PrivateUse1 hooks and generators: what torch.accelerator
// and autograd ask of a device.
//
// A process can use `usable` chips, tpu:0..usable-1 (a plain process on a multi-chip host
// sees them all; a torchrun rank sees its own chip as tpu:0). It is bound to tpu:0: ops run
// on whichever chip their tensors are on (the guard switches internally), but
// torch.accelerator.set_device_index() to another chip raises, as on TorchTPU.
#include "tpu_core.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <array>
#include <chrono>
#include <mutex>
#include <sstream>
#include <unordered_set>

namespace hf_tpu {
namespace {

constexpr int kMaxDevices = 64;
std::atomic<int> g_usable{1};
std::atomic<int> g_reported{1};
thread_local c10::DeviceIndex t_current_device = 0;

void check_bound(c10::DeviceIndex index) {
  const int usable = g_usable.load();
  TORCH_CHECK(index < usable, "Device index ", static_cast<int>(index),
              " is out of bounds of the number of addressable devices ", usable);  // TorchTPU's words
  TORCH_CHECK_VALUE(
      index <= 0, "Cannot set TPU device to index ", static_cast<int>(index),
      ", current process is bound to device index 0. Changing the active TPU device within a process is not "
      "supported (as on TorchTPU): put tensors on tpu:", static_cast<int>(index),
      " explicitly, or launch one process per chip (`hf-tpu launch -n N`).");
}

// ---- pinned host memory ------------------------------------------------------
// TorchTPU has a pinned-memory host allocator: `pin_memory()` answers `is_pinned() == True`, and DDP's
// unused-parameter detection asserts it. Host memory here is plain CPU memory that remembers it was pinned.
struct PinnedAllocator final : public c10::Allocator {
  static void release(void* ptr) {
    {
      std::lock_guard<std::mutex> lock(mutex());
      live().erase(ptr);
    }
    c10::free_cpu(ptr);
  }
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nbytes == 0 ? nullptr : c10::alloc_cpu(nbytes);
    if (ptr != nullptr) {
      std::lock_guard<std::mutex> lock(mutex());
      live().insert(ptr);
    }
    return {ptr, ptr, &PinnedAllocator::release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &PinnedAllocator::release;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  static bool owns(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex());
    return live().count(const_cast<void*>(ptr)) != 0;
  }

 private:
  static std::mutex& mutex() {
    static auto* m = new std::mutex();  // leaked: tensors may be freed during static destruction
    return *m;
  }
  static std::unordered_set<void*>& live() {
    static auto* set = new std::unordered_set<void*>();
    return *set;
  }
};

PinnedAllocator* pinned_allocator() {
  static auto* allocator = new PinnedAllocator();
  return allocator;
}

// ---- generator -------------------------------------------------------------
// Wraps a CPU Philox/MT generator so CPU kernels can draw from it (they check the
// generator's type); the fallback swaps the wrapper for the wrapped generator.
struct TpuGeneratorImpl final : public c10::GeneratorImpl {
  explicit TpuGeneratorImpl(c10::DeviceIndex index)
      : c10::GeneratorImpl(c10::Device(kTpu, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        cpu_(at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val)) {}

  // Python's manual_seed/get_state lock this wrapper's mutex, CPU kernels lock the wrapped
  // generator's (the fallback hands them `cpu_`): every access here takes the latter too.
  void set_current_seed(uint64_t seed) override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    cpu_.set_current_seed(seed);
  }
  void set_offset(uint64_t offset) override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    cpu_.set_offset(offset);
  }
  uint64_t get_offset() const override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    return cpu_.get_offset();
  }
  uint64_t current_seed() const override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    return cpu_.current_seed();
  }
  uint64_t seed() override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    return cpu_.seed();
  }
  void set_state(const c10::TensorImpl& new_state) override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    cpu_.unsafeGetGeneratorImpl()->set_state(new_state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    return cpu_.unsafeGetGeneratorImpl()->get_state();
  }
  TpuGeneratorImpl* clone_impl() const override {
    auto* copy = new TpuGeneratorImpl(device_.index());
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    copy->cpu_ = cpu_.clone();
    return copy;
  }

  mutable at::Generator cpu_;  // mutable: locking its mutex is not a change of state
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
  // Device guards (ops on tpu:N, torch.accelerator.device_index) switch the thread's device;
  // an explicit set_device to another chip is refused, as on TorchTPU.
  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::DeviceIndex previous = t_current_device;
    t_current_device = checked_device_index(d.index());
    return {kTpu, previous};
  }
  c10::Device getDevice() const override {
    return {kTpu, t_current_device};
  }
  void setDevice(c10::Device d) const override {
    check_bound(d.index());
    t_current_device = 0;
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    t_current_device = d.index() < 0 ? 0 : d.index();
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
    return static_cast<c10::DeviceIndex>(g_reported.load());
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
    rebind_if_forked();
    return static_cast<c10::DeviceIndex>(g_reported.load());
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    check_bound(device);
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return t_current_device;
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const c10::DeviceIndex previous = t_current_device;
    t_current_device = checked_device_index(device);
    return previous;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return at::make_generator<TpuGeneratorImpl>(checked_device_index(device_index));
  }
  at::Device getDeviceFromPtr(void* /*data*/) const override {
    return {kTpu, t_current_device};
  }
  bool isPinnedPtr(const void* data) const override {
    return PinnedAllocator::owns(data);
  }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return pinned_allocator();
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
    // Leaked on purpose: torch may still call the hooks while static objects are destroyed at exit.
    at::RegisterPrivateUse1HooksInterface(new TpuHooks());
  }
} g_register_hooks;

}  // namespace

void set_device_counts(int usable, int reported) {
  TORCH_CHECK(usable >= 1 && usable <= kMaxDevices && reported >= usable && reported <= kMaxDevices,
              "hf-tpu emulator: invalid device counts (usable ", usable, ", reported ", reported, ")");
  g_usable = usable;
  g_reported = reported;
}
namespace {
std::atomic<bool> g_rebind_pending{false};
std::function<void()>* g_rebind_hook = nullptr;  // leaked on purpose, like the hooks
}  // namespace

void set_rebind_hook(std::function<void()> hook) {
  delete g_rebind_hook;
  g_rebind_hook = new std::function<void()>(std::move(hook));
}
void mark_forked() {
  g_rebind_pending.store(true, std::memory_order_release);
}
void rebind_if_forked() {
  if (g_rebind_pending.load(std::memory_order_relaxed) && g_rebind_pending.exchange(false) && g_rebind_hook) {
    try {
      (*g_rebind_hook)();
    } catch (...) {
      mark_forked();  // not bound yet: the next device use raises the same error
      throw;
    }
  }
}

int usable_device_count() {
  rebind_if_forked();
  return g_usable.load();
}
int reported_device_count() {
  return g_reported.load();
}
c10::DeviceIndex current_device() {
  return t_current_device;
}

c10::DeviceIndex checked_device_index(c10::DeviceIndex index) {
  rebind_if_forked();
  if (index < 0) {
    return t_current_device;
  }
  const int usable = g_usable.load();
  if (index < usable) {
    return index;
  }
  const int reported = g_reported.load();
  std::ostringstream why;
  if (index < reported) {
    why << "tpu:" << static_cast<int>(index) << " is not visible to this process: it can use " << usable
        << " of the host's " << reported
        << " chip(s) (TPU_VISIBLE_DEVICES / TPU_VISIBLE_CHIPS), but device_count() still reports " << reported
        << " (TorchTPU gap 'visible_devices'). Use tpu:0..tpu:" << usable - 1 << ".";
  } else if (usable == 1) {  // TorchTPU's words first, then what to do
    why << "Device index " << static_cast<int>(index) << " is out of bounds of the number of addressable devices 1"
        << ": this process has one TPU chip, tpu:0 (a torchrun rank sees only its own chip; launch one process per "
           "chip with `hf-tpu launch -n N`, or emulate a larger host with HF_TPU_EMULATOR_CHIPS).";
  } else {
    why << "Device index " << static_cast<int>(index) << " is out of bounds of the number of addressable devices "
        << usable << ": this process has " << usable << " TPU chips, tpu:0..tpu:" << usable - 1 << ".";
  }
  TORCH_CHECK(false, why.str());
  return 0;  // unreachable
}

DeviceScope::DeviceScope(c10::DeviceIndex index) : previous_(t_current_device) {
  t_current_device = checked_device_index(index);
}
DeviceScope::~DeviceScope() {
  t_current_device = previous_;
}

const at::Generator& default_generator(c10::DeviceIndex index) {
  static std::array<at::Generator, kMaxDevices> generators;
  static std::once_flag once;
  std::call_once(once, [] {
    for (int i = 0; i < kMaxDevices; ++i) {
      generators[i] = at::make_generator<TpuGeneratorImpl>(static_cast<c10::DeviceIndex>(i));
    }
  });
  return generators[static_cast<size_t>(checked_device_index(index))];
}

bool is_tpu_generator(const at::Generator& generator) {
  return generator.defined() && generator.device().type() == kTpu;
}

at::Generator cpu_generator_of(const at::Generator& tpu_generator) {
  return static_cast<TpuGeneratorImpl*>(tpu_generator.unsafeGetGeneratorImpl())->cpu_;
}

}  // namespace hf_tpu
