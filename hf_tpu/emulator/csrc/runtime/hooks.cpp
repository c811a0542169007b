// torch's PrivateUse1 hooks for the device (at::PrivateUse1HooksInterface): what torch.accelerator and autograd ask.
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/generator.h"
#include "runtime/pinned.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>

#include <algorithm>
#include <cstring>

namespace hf_tpu {
namespace {

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
    return static_cast<c10::DeviceIndex>(reported_device_count());
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    check_bound(device);
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return current_device();
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    return exchange_current_device(device);
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return new_generator(checked_device_index(device_index));
  }
  at::Device getDeviceFromPtr(void* /*data*/) const override {
    return {kTpu, current_device()};
  }
  bool isPinnedPtr(const void* data) const override {
    return is_pinned(data);
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
}  // namespace hf_tpu
