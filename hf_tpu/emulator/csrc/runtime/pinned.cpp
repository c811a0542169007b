// Pinned host memory. TorchTPU has a pinned-memory host allocator: `pin_memory()` answers `is_pinned() == True`,
// and DDP's unused-parameter detection asserts it. Host memory here is plain CPU memory that remembers it was pinned.
#include "runtime/pinned.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <mutex>
#include <unordered_set>

namespace hf_tpu {
namespace {

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


}  // namespace

c10::Allocator* pinned_allocator() {
  static auto* allocator = new PinnedAllocator();
  return allocator;
}

bool is_pinned(const void* ptr) {
  return PinnedAllocator::owns(ptr);
}

}  // namespace hf_tpu
