// The emulated chips' HBM: host memory with CUDA-style accounting and a hard capacity per chip.
//
// There is no caching: memory is returned to the host as soon as a tensor dies, so
// "reserved" always equals "allocated". What matters for users is that the numbers
// torch.accelerator reports and the point at which a model stops fitting behave like
// a chip with the emulated generation's HBM.
//
// A chip is "opened" on its first allocation, as TorchTPU's runtime opens chips lazily:
// with the device_sharing gap on, that takes an exclusive lock on the chip's file of the
// emulated host, so a second process that opens a held chip fails as on a TPU VM.
#include "tpu_core.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <sstream>
#include <utility>

namespace hf_tpu {
namespace {

using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;

std::string format_bytes(int64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  std::ostringstream os;
  os.precision(u == 0 ? 0 : 2);
  os << std::fixed << v << " " << units[u];
  return os.str();
}

class TpuAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    release_deferred_storages();
    const c10::DeviceIndex index = current_device();
    const c10::Device device(kTpu, index);
    if (nbytes == 0) {
      return {nullptr, nullptr, &noop_delete, device};
    }
    reserve(index, nbytes);
    void* ptr = nullptr;
    try {
      ptr = c10::alloc_cpu(nbytes);
    } catch (const c10::Error& err) {
      release(index, nbytes);
      // The emulated HBM fits, the host's RAM does not: still an out-of-memory error, naming the host.
      TORCH_CHECK_WITH(OutOfMemoryError, false, "TPU out of memory on tpu:", static_cast<int>(index),
                       " (emulated): the host could not provide ", nbytes,
                       " bytes of RAM for it (the emulated HBM is host memory). Lower HF_TPU_EMULATOR_HBM to what "
                       "this machine's RAM can hold, or use smaller batches. (", err.what_without_backtrace(), ")");
    }
    auto* ctx = new OwnedBlock{ptr, nbytes, index};
    return {ptr, ctx, &delete_owned, device};
  }

  c10::DataPtr adopt(const c10::Storage& cpu_storage, c10::DeviceIndex index) {
    const c10::Device device(kTpu, index);
    void* ptr = const_cast<void*>(cpu_storage.data_ptr().get());
    const size_t nbytes = cpu_storage.nbytes();
    if (ptr == nullptr || nbytes == 0) {
      // Keep the (empty) CPU storage alive anyway: its DataPtr may carry a context.
      auto* ctx = new AdoptedBlock{cpu_storage, 0, index};
      return {ptr, ctx, &delete_adopted, device};
    }
    reserve(index, nbytes);
    auto* ctx = new AdoptedBlock{cpu_storage, nbytes, index};
    return {ptr, ctx, &delete_adopted, device};
  }

  void set_locks(std::vector<std::string> paths, std::vector<std::string> labels) {
    std::lock_guard<std::mutex> lock(mutex_);
    lock_paths_ = std::move(paths);
    lock_labels_ = std::move(labels);
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  bool initialized() override {
    return true;
  }
  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {}
  void recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) override {}

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_[stat_index(device)];
  }

  void resetAccumulatedStats(c10::DeviceIndex /*device*/) override {
    // TorchTPU 0.2.0 does not implement this either; mirror its message.
    TORCH_CHECK_NOT_IMPLEMENTED(
        false, "torch.accelerator.memory.reset_accumulated_memory_stats is not implemented for TPU.");
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceStats& stats = stats_[stat_index(device)];
    for (auto* arr : {&stats.allocation, &stats.segment, &stats.active, &stats.allocated_bytes,
                      &stats.reserved_bytes, &stats.active_bytes, &stats.requested_bytes}) {
      for (auto& s : *arr) {
        s.reset_peak();
      }
    }
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t used = stats_[stat_index(device)].reserved_bytes[0].current;
    return {static_cast<size_t>(std::max<int64_t>(capacity_ - used, 0)), static_cast<size_t>(capacity_)};
  }

  void set_capacity(int64_t bytes) {
    TORCH_CHECK(bytes > 0, "HBM capacity must be positive, got ", bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    capacity_ = bytes;
  }
  int64_t capacity() {
    std::lock_guard<std::mutex> lock(mutex_);
    return capacity_;
  }
  bool any_opened() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::any_of(opened_.begin(), opened_.end(), [](bool opened) { return opened; });
  }
  int64_t take_largest_allocation() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(largest_, 0);
  }

 private:
  struct OwnedBlock {
    void* ptr;
    size_t nbytes;
    c10::DeviceIndex device;
  };
  struct AdoptedBlock {
    c10::Storage storage;
    size_t nbytes;
    c10::DeviceIndex device;
  };

  static void noop_delete(void* /*ctx*/) {}
  static void delete_owned(void* ctx) {
    auto* block = static_cast<OwnedBlock*>(ctx);
    c10::free_cpu(block->ptr);
    instance().release(block->device, block->nbytes);
    delete block;
  }
  static void delete_adopted(void* ctx) {
    auto* block = static_cast<AdoptedBlock*>(ctx);
    if (block->nbytes > 0) {
      instance().release(block->device, block->nbytes);
    }
    if (block->storage.use_count() == 1 && !frees_without_python(block->storage) && !on_main_thread()) {
      defer(std::move(block->storage));  // e.g. a DLPack capsule's memory, dropped by autograd's worker
    }
    delete block;
  }
  // Memory from torch's CPU allocators is freed without Python; anything else (DLPack, NumPy
  // buffers) may take the GIL in its deleter.
  static bool frees_without_python(const c10::Storage& storage) {
    const c10::DeleterFnPtr deleter = storage.data_ptr().get_deleter();
    return deleter == nullptr || deleter == c10::GetDefaultCPUAllocator()->raw_deleter() ||
           deleter == c10::GetCPUAllocator()->raw_deleter();
  }
  static void defer(c10::Storage storage) {
    std::lock_guard<std::mutex> lock(deferred_mutex());
    deferred().push_back(std::move(storage));
    has_deferred().store(true, std::memory_order_release);
  }

 public:
  static std::mutex& deferred_mutex() {
    static auto* m = new std::mutex();  // leaked: may be used while statics are destroyed
    return *m;
  }
  static std::vector<c10::Storage>& deferred() {
    static auto* v = new std::vector<c10::Storage>();  // leaked: never freed without the GIL
    return *v;
  }
  static std::atomic<bool>& has_deferred() {
    static std::atomic<bool> flag{false};
    return flag;
  }

 public:
  static TpuAllocator& instance();

 private:
  static constexpr size_t kMaxDevices = 64;

  static size_t stat_index(c10::DeviceIndex device) {
    const auto index = static_cast<size_t>(device < 0 ? current_device() : device);
    TORCH_CHECK(index < kMaxDevices, "tpu:", index, " is not a device of the emulated TPU host.");
    return index;
  }

  // Called with mutex_ held: the first allocation on a chip opens it.
  void open_device(c10::DeviceIndex device) {
    const auto index = static_cast<size_t>(device);
    if (opened_[index]) {
      return;
    }
    if (index < lock_paths_.size() && !lock_paths_[index].empty()) {
      const std::string& path = lock_paths_[index];
      const std::string& label = lock_labels_[index];
      const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
      TORCH_CHECK(fd >= 0, "hf-tpu emulator: cannot open the chip lock ", path, ": ", std::strerror(errno));
      if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char holder[32] = {0};
        const ssize_t n = ::pread(fd, holder, sizeof(holder) - 1, 0);
        ::close(fd);
        std::string pid = n > 0 ? std::string(holder, static_cast<size_t>(n)) : std::string("unknown");
        while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) {
          pid.pop_back();
        }
        gap_abort(Gap::kDeviceSharing, "the runtime cannot open " + label + ": process " + pid +
                                           " holds it (lock " + path + ")");
      }
      const std::string pid = std::to_string(::getpid()) + "\n";
      if (::ftruncate(fd, 0) == 0) {
        (void)!::pwrite(fd, pid.data(), pid.size(), 0);
      }
      // The descriptor stays open (and locked) until the process exits, as a TPU chip stays held.
    }
    opened_[index] = true;
  }

  void reserve(c10::DeviceIndex device, size_t nbytes) {
    rebind_if_forked();  // before the lock: rebinding sets this allocator's chip locks
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t index = stat_index(device);
    open_device(static_cast<c10::DeviceIndex>(index));
    DeviceStats& stats = stats_[index];
    const int64_t in_use = stats.reserved_bytes[0].current;
    if (in_use + static_cast<int64_t>(nbytes) > capacity_) {
      stats.num_ooms += 1;
      TORCH_CHECK_WITH(
          OutOfMemoryError, false, "TPU out of memory on tpu:", index, " (emulated): tried to allocate ",
          format_bytes(nbytes), "; ", format_bytes(in_use), " already in use of the chip's ",
          format_bytes(capacity_), " HBM (", format_bytes(std::max<int64_t>(capacity_ - in_use, 0)),
          " free). Free tensors you no longer need, shard the model over more chips, or raise the "
          "emulated capacity with HF_TPU_EMULATOR_HBM (e.g. HF_TPU_EMULATOR_HBM=64GiB).");
    }
    for (auto* arr : {&stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes,
                      &stats.requested_bytes}) {
      (*arr)[0].increase(nbytes);
      (*arr)[static_cast<size_t>(StatType::LARGE_POOL)].increase(nbytes);
    }
    for (auto* arr : {&stats.allocation, &stats.segment, &stats.active}) {
      (*arr)[0].increase(1);
      (*arr)[static_cast<size_t>(StatType::LARGE_POOL)].increase(1);
    }
    stats.num_device_alloc += 1;
    largest_ = std::max<int64_t>(largest_, static_cast<int64_t>(nbytes));
  }

  void release(c10::DeviceIndex device, size_t nbytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceStats& stats = stats_[static_cast<size_t>(device)];
    for (auto* arr : {&stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes,
                      &stats.requested_bytes}) {
      (*arr)[0].decrease(nbytes);
      (*arr)[static_cast<size_t>(StatType::LARGE_POOL)].decrease(nbytes);
    }
    for (auto* arr : {&stats.allocation, &stats.segment, &stats.active}) {
      (*arr)[0].decrease(1);
      (*arr)[static_cast<size_t>(StatType::LARGE_POOL)].decrease(1);
    }
    stats.num_device_free += 1;
  }

  std::mutex mutex_;
  std::array<DeviceStats, kMaxDevices> stats_;
  std::array<bool, kMaxDevices> opened_{};
  std::vector<std::string> lock_paths_;
  std::vector<std::string> lock_labels_;
  int64_t capacity_ = int64_t{32} << 30;  // TPU v6e; Python sets the generation's value.
  int64_t largest_ = 0;                    // largest single allocation since last asked
};

TpuAllocator& TpuAllocator::instance() {
  static TpuAllocator* allocator = new TpuAllocator();  // never destroyed: tensors may outlive statics
  return *allocator;
}

}  // namespace

c10::DeviceAllocator* device_allocator() {
  return &TpuAllocator::instance();
}
void set_capacity(int64_t bytes) {
  TpuAllocator::instance().set_capacity(bytes);
}
int64_t capacity() {
  return TpuAllocator::instance().capacity();
}
int64_t take_largest_allocation() {
  return TpuAllocator::instance().take_largest_allocation();
}
void release_deferred_storages() {
  if (!TpuAllocator::has_deferred().load(std::memory_order_acquire) || !on_main_thread()) {
    return;
  }
  std::vector<c10::Storage> storages;
  {
    std::lock_guard<std::mutex> lock(TpuAllocator::deferred_mutex());
    storages.swap(TpuAllocator::deferred());
    TpuAllocator::has_deferred().store(false, std::memory_order_release);
  }
  // Freed here, outside the lock, on the main thread (their deleters may take the GIL).
}

c10::DataPtr adopt_cpu_storage(const c10::Storage& cpu_storage, c10::DeviceIndex device) {
  return TpuAllocator::instance().adopt(cpu_storage, device);
}
bool any_device_opened() {
  return TpuAllocator::instance().any_opened();
}
void set_device_locks(std::vector<std::string> paths, std::vector<std::string> labels) {
  TORCH_CHECK(paths.size() == labels.size(), "set_device_locks: one label per path");
  TpuAllocator::instance().set_locks(std::move(paths), std::move(labels));
}

// Registered through a function-local static so the object exists before first use.
static c10::AllocatorRegisterer<kTpu> g_register_allocator(&TpuAllocator::instance());

}  // namespace hf_tpu
