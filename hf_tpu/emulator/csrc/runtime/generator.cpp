// Random generators of the device.
#include "runtime/generator.h"
#include "runtime/allocator.h"

#include "runtime/device.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>

#include <array>
#include <mutex>

namespace hf_tpu {
namespace {

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

}  // namespace

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

at::Generator new_generator(c10::DeviceIndex index) {
  return at::make_generator<TpuGeneratorImpl>(index);
}

}  // namespace hf_tpu
