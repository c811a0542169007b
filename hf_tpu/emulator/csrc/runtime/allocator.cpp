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
#include "runtime/allocator.h"
#include "aten/fallback.h"
#include "aten/numerics.h"
#include "aten/tensors.h"
#include "runtime/device.h"
#include "tpu/gaps.h"
#include "tpu/tracking.h"

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
#include <thread>
#include <typeinfo>
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

// The stats lock: held for a few counter updates per allocation, so a spin (yielding if it ever waits)
// costs less than a mutex on the path every op's output takes.
class SpinLock {
 public:
  void lock() {
    while (flag_.test_and_set(std::memory_order_acquire)) {
      std::this_thread::yield();
    }
  }
  void unlock() {
    flag_.clear(std::memory_order_release);
  }

 private:
  std::atomic_flag flag_ = ATOMIC_FLAG_INIT;
};

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
    auto* ctx = new OwnedBlock(nbytes, index, ptr);
    return {ptr, static_cast<Block*>(ctx), &delete_owned, device};
  }

  c10::DataPtr adopt(const c10::Storage& cpu_storage, c10::DeviceIndex index) {
    const c10::Device device(kTpu, index);
    void* ptr = const_cast<void*>(cpu_storage.data_ptr().get());
    const size_t nbytes = cpu_storage.nbytes();
    if (ptr == nullptr || nbytes == 0) {
      // Keep the (empty) CPU storage alive anyway: its DataPtr may carry a context.
      auto* ctx = new AdoptedBlock(0, index, cpu_storage);
      return {ptr, static_cast<Block*>(ctx), &delete_adopted, device};
    }
    reserve(index, nbytes);
    auto* ctx = new AdoptedBlock(nbytes, index, cpu_storage);
    return {ptr, static_cast<Block*>(ctx), &delete_adopted, device};
  }

  // Turn a fresh CPU kernel output into device memory in place: its storage takes the memory
  // (counted on `index`) and the device allocator; no new storage, tensor or copy.
  bool take(const at::Tensor& cpu_out, c10::DeviceIndex index) {
    c10::TensorImpl* impl = cpu_out.unsafeGetTensorImpl();
    // A plain dense tensor (not quantized, nested, a subclass...), held by the caller alone.
    if (typeid(*impl) != typeid(c10::TensorImpl) || !cpu_out.has_storage() || cpu_out.use_count() != 1 ||
        impl->key_set().has(c10::DispatchKey::Python)) {
      return false;
    }
    c10::StorageImpl* storage = cpu_out.storage().unsafeGetStorageImpl();
    const c10::DataPtr& memory = storage->data_ptr();
    const size_t nbytes = storage->nbytes();
    // Only memory of torch's CPU allocators (freed without Python; not copy-on-write, not a DLPack
    // capsule's), held by this one tensor.
    if (cpu_out.storage().use_count() != 1 || memory.get() == nullptr || nbytes == 0 || memory.device().type() != c10::kCPU ||
        (memory.get_deleter() != c10::GetDefaultCPUAllocator()->raw_deleter() &&
         memory.get_deleter() != c10::GetCPUAllocator()->raw_deleter())) {
      return false;
    }
    reserve(index, nbytes);
    void* ptr = memory.get();
    auto* ctx = new TakenBlock(nbytes, index, storage->set_data_ptr(c10::DataPtr()));
    storage->set_data_ptr_noswap({ptr, static_cast<Block*>(ctx), &delete_taken, c10::Device(kTpu, index)});
    storage->set_allocator(this);
    impl->set_storage_keep_dtype(cpu_out.storage());  // the tensor's device follows its storage's
    impl->_change_backend_component_keys(c10::Device(kTpu, index));
    return true;
  }

  // A CPU storage over a device storage's memory, made once per allocation and kept with it.
  // Not resizable: for arguments a kernel reads or writes in place, never for out= arguments.
  static c10::Storage cpu_alias_storage(const c10::Storage& device_storage) {
    const c10::DataPtr& memory = device_storage.data_ptr();
    Block* block = block_of(memory);
    if (block == nullptr || memory.get() == nullptr) {
      return {};
    }
    c10::StorageImpl* alias = block->alias.load(std::memory_order_acquire);
    if (alias == nullptr) {
      auto made = c10::make_intrusive<c10::StorageImpl>(
          c10::StorageImpl::use_byte_size_t(), device_storage.nbytes(),
          c10::DataPtr(memory.get(), c10::Device(c10::DeviceType::CPU)), nullptr, /*resizable=*/false);
      c10::StorageImpl* expected = nullptr;
      if (block->alias.compare_exchange_strong(expected, made.get(), std::memory_order_acq_rel)) {
        alias = made.release();
      } else {
        alias = expected;  // another thread made it first
      }
    }
    return c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::unsafe_reclaim_from_nonowning(alias));
  }

  void set_locks(std::vector<std::string> paths, std::vector<std::string> labels) {
    std::lock_guard<SpinLock> lock(mutex_);
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
    Usage usage;
    {
      std::lock_guard<SpinLock> lock(mutex_);
      usage = usage_[stat_index(device)];
    }
    // No caching: every byte allocated is reserved, active and requested, every allocation is a segment
    // and active, all in the one ("large") pool.
    DeviceStats stats;
    for (size_t pool : {size_t{0}, static_cast<size_t>(StatType::LARGE_POOL)}) {
      for (auto* arr : {&stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes, &stats.requested_bytes}) {
        (*arr)[pool] = usage.bytes;
      }
      for (auto* arr : {&stats.allocation, &stats.segment, &stats.active}) {
        (*arr)[pool] = usage.blocks;
      }
    }
    stats.num_ooms = usage.num_ooms;
    stats.num_device_alloc = usage.blocks.allocated;
    stats.num_device_free = usage.blocks.freed;
    return stats;
  }

  void resetAccumulatedStats(c10::DeviceIndex /*device*/) override {
    // TorchTPU 0.2.0 does not implement this either; mirror its message.
    TORCH_CHECK_NOT_IMPLEMENTED(
        false, "torch.accelerator.memory.reset_accumulated_memory_stats is not implemented for TPU.");
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    std::lock_guard<SpinLock> lock(mutex_);
    Usage& usage = usage_[stat_index(device)];
    usage.bytes.reset_peak();
    usage.blocks.reset_peak();
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    std::lock_guard<SpinLock> lock(mutex_);
    const int64_t used = usage_[stat_index(device)].bytes.current;
    return {static_cast<size_t>(std::max<int64_t>(capacity_ - used, 0)), static_cast<size_t>(capacity_)};
  }

  void set_capacity(int64_t bytes) {
    TORCH_CHECK(bytes > 0, "HBM capacity must be positive, got ", bytes);
    std::lock_guard<SpinLock> lock(mutex_);
    capacity_ = bytes;
  }
  int64_t capacity() {
    std::lock_guard<SpinLock> lock(mutex_);
    return capacity_;
  }
  bool any_opened() {
    std::lock_guard<SpinLock> lock(mutex_);
    return std::any_of(opened_.begin(), opened_.end(), [](bool opened) { return opened; });
  }
  int64_t take_largest_allocation() {
    std::lock_guard<SpinLock> lock(mutex_);
    return std::exchange(largest_, 0);
  }

 private:
  // What a device allocation's DataPtr context holds: its size and chip, and its CPU alias storage once made.
  struct Block {
    Block(size_t n, c10::DeviceIndex d) : nbytes(n), device(d) {}
    Block(const Block&) = delete;
    Block& operator=(const Block&) = delete;
    virtual ~Block() {
      if (c10::StorageImpl* a = alias.load(std::memory_order_acquire)) {
        c10::raw::intrusive_ptr::decref(a);
      }
    }
    size_t nbytes;
    c10::DeviceIndex device;
    std::atomic<c10::StorageImpl*> alias{nullptr};
  };
  struct OwnedBlock final : Block {  // allocated here
    OwnedBlock(size_t n, c10::DeviceIndex d, void* p) : Block(n, d), ptr(p) {}
    void* ptr;
  };
  struct AdoptedBlock final : Block {  // a CPU storage's memory, the storage kept alive
    AdoptedBlock(size_t n, c10::DeviceIndex d, c10::Storage s) : Block(n, d), storage(std::move(s)) {}
    c10::Storage storage;
  };
  struct TakenBlock final : Block {  // a CPU allocation taken over (see take)
    TakenBlock(size_t n, c10::DeviceIndex d, c10::DataPtr m) : Block(n, d), memory(std::move(m)) {}
    c10::DataPtr memory;
  };

  static Block* block_of(const c10::DataPtr& memory) {
    const c10::DeleterFnPtr deleter = memory.get_deleter();
    if (deleter == &delete_owned || deleter == &delete_adopted || deleter == &delete_taken) {
      return static_cast<Block*>(memory.get_context());
    }
    return nullptr;
  }

  static void noop_delete(void* /*ctx*/) {}
  static void delete_owned(void* ctx) {
    auto* block = static_cast<OwnedBlock*>(static_cast<Block*>(ctx));
    c10::free_cpu(block->ptr);
    instance().release(block->device, block->nbytes);
    delete block;
  }
  static void delete_taken(void* ctx) {
    auto* block = static_cast<TakenBlock*>(static_cast<Block*>(ctx));
    instance().release(block->device, block->nbytes);
    delete block;  // frees the memory (torch's CPU allocator: no Python involved)
  }
  static void delete_adopted(void* ctx) {
    auto* block = static_cast<AdoptedBlock*>(static_cast<Block*>(ctx));
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
    std::lock_guard<SpinLock> lock(mutex_);
    const size_t index = stat_index(device);
    open_device(static_cast<c10::DeviceIndex>(index));
    Usage& usage = usage_[index];
    const int64_t in_use = usage.bytes.current;
    if (in_use + static_cast<int64_t>(nbytes) > capacity_) {
      usage.num_ooms += 1;
      TORCH_CHECK_WITH(
          OutOfMemoryError, false, "TPU out of memory on tpu:", index, " (emulated): tried to allocate ",
          format_bytes(nbytes), "; ", format_bytes(in_use), " already in use of the chip's ",
          format_bytes(capacity_), " HBM (", format_bytes(std::max<int64_t>(capacity_ - in_use, 0)),
          " free). Free tensors you no longer need, shard the model over more chips, or raise the "
          "emulated capacity with HF_TPU_EMULATOR_HBM (e.g. HF_TPU_EMULATOR_HBM=64GiB).");
    }
    usage.bytes.increase(nbytes);
    usage.blocks.increase(1);
    largest_ = std::max<int64_t>(largest_, static_cast<int64_t>(nbytes));
  }

  void release(c10::DeviceIndex device, size_t nbytes) {
    std::lock_guard<SpinLock> lock(mutex_);
    Usage& usage = usage_[static_cast<size_t>(device)];
    usage.bytes.decrease(nbytes);
    usage.blocks.decrease(1);
  }

  // A chip's usage; getDeviceStats expands it into torch's DeviceStats (whose 14 counters all follow
  // these two here), so an allocation updates two counters, not fourteen.
  struct Usage {
    c10::CachingAllocator::Stat bytes;
    c10::CachingAllocator::Stat blocks;
    int64_t num_ooms = 0;
  };

  SpinLock mutex_;
  std::array<Usage, kMaxDevices> usage_;
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
bool take_cpu_output(const at::Tensor& cpu_out, c10::DeviceIndex device) {
  return TpuAllocator::instance().take(cpu_out, device);
}
c10::Storage cpu_alias_storage(const c10::Storage& device_storage) {
  return TpuAllocator::cpu_alias_storage(device_storage);
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
