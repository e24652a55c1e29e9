#include "storage.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <sys/mman.h>

#include <array>
#include <map>
#include <unordered_map>
#include <mutex>
#include <vector>

#include "fusion.h"

namespace tpuc {
namespace {

// Slots by their storage's address: a storage PyTorch makes over another's memory (its legacy
// serialization does) is known by it.
std::mutex g_slots_mutex;
std::unordered_map<const void*, Slot*> g_slots;

// The addresses storages are given: each a range of its size no other live storage overlaps
// (torch checks overlaps by address) and no memory backs (the device's memory is not the
// host's). They are cut from one region of address space reserved once, by size class (powers
// of two from 64 bytes), and reused when freed, so that a storage costs no system call; a range
// the region cannot give is reserved on its own.
class AddressSpace {
 public:
  // Under g_slots_mutex, as `give`.
  void* take(size_t nbytes) {
    size_t size_class = class_of(nbytes);
    auto& free = free_[size_class];
    if (!free.empty()) {
      void* address = free.back();
      free.pop_back();
      return address;
    }
    reserve();
    size_t bytes = size_t{1} << size_class;
    if (base_ != nullptr && size_class < kClasses && size_ - used_ >= bytes) {
      void* address = base_ + used_;
      used_ += bytes;
      return address;
    }
    void* address = mmap(nullptr, nbytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return address == MAP_FAILED ? nullptr : address;
  }

  void give(void* address, size_t nbytes) {
    auto* start = static_cast<char*>(address);
    if (base_ != nullptr && start >= base_ && start < base_ + size_) {
      free_[class_of(nbytes)].push_back(address);
    } else {
      munmap(address, nbytes);
    }
  }

 private:
  static constexpr size_t kClasses = 48;

  static size_t class_of(size_t nbytes) {
    size_t size_class = 6;
    while (size_class < kClasses && (size_t{1} << size_class) < nbytes) ++size_class;
    return size_class;
  }

  void reserve() {
    if (tried_) return;
    tried_ = true;
    for (size_t size : {size_t{1} << 44, size_t{1} << 40, size_t{1} << 36}) {
      void* region = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (region != MAP_FAILED) {
        base_ = static_cast<char*>(region);
        size_ = size;
        return;
      }
    }
  }

  bool tried_ = false;
  char* base_ = nullptr;
  size_t size_ = 0, used_ = 0;
  std::array<std::vector<void*>, kClasses + 1> free_;
};

AddressSpace g_addresses;

void release(void* context) {
  auto* slot = static_cast<Slot*>(context);
  if (slot->address != nullptr) {
    std::lock_guard<std::mutex> lock(g_slots_mutex);
    g_slots.erase(slot->address);
    g_addresses.give(slot->address, slot->nbytes);
  }
  delete slot;
}

class Allocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    c10::DeviceIndex device = 0;
    if (auto guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)) {
      device = guard->getDevice().index();
    }
    auto* slot = new Slot();
    slot->nbytes = nbytes;
    slot->device = device;
    if (nbytes > 0) {
      std::unique_lock<std::mutex> lock(g_slots_mutex);
      void* address = g_addresses.take(nbytes);
      if (address == nullptr) {
        lock.unlock();
        delete slot;
        TORCH_CHECK(false, "tpuc: no address space left for a tensor of ", nbytes, " bytes");
      }
      slot->address = address;
      g_slots[address] = slot;
    }
    return {slot->address, slot, &release, c10::Device(c10::DeviceType::PrivateUse1, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    TORCH_CHECK(false, "tpuc: the device's memory is not addressable; copy tensors with copy_");
  }
};

Allocator g_allocator;
// The device's allocator for storages made without a tensor (torch.UntypedStorage(n, device=...),
// which loading a saved tensor makes).
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

// Live pinned allocations: start -> size.
std::mutex g_pinned_mutex;
std::map<const char*, size_t> g_pinned;

void free_pinned(void* address) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned.erase(static_cast<const char*>(address));
  }
  c10::free_cpu(address);
}

class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* address = nbytes == 0 ? nullptr : c10::alloc_cpu(nbytes);
    if (address != nullptr) {
      std::lock_guard<std::mutex> lock(g_pinned_mutex);
      g_pinned[static_cast<const char*>(address)] = nbytes;
    }
    return {address, address, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

PinnedAllocator g_pinned_allocator;
}  // namespace

c10::Allocator* allocator() { return &g_allocator; }

c10::Allocator* pinned_allocator() { return &g_pinned_allocator; }

bool is_pinned(const void* address) {
  const char* at = static_cast<const char*>(address);
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  auto after = g_pinned.upper_bound(at);
  if (after == g_pinned.begin()) return false;
  auto found = std::prev(after);
  return at < found->first + found->second;
}

Slot& slot_of(const at::TensorBase& tensor) {
  const auto& data = tensor.storage().data_ptr();
  if (data.get_deleter() == &release) return *static_cast<Slot*>(data.get_context());
  if (data.get() != nullptr) {
    std::lock_guard<std::mutex> lock(g_slots_mutex);
    auto found = g_slots.find(data.get());
    if (found != g_slots.end()) return *found->second;
  }
  TORCH_CHECK(false, "tpuc: a tensor of the tpuc device whose storage the device did not allocate ",
              "(a DLPack import of a view that starts inside its storage is one: export the view's ",
              ".clone(), or the whole tensor, instead)");
}

bool covers(const at::TensorBase& tensor) {
  return tensor.storage_offset() == 0 && tensor.is_contiguous() &&
         static_cast<size_t>(tensor.numel()) * tensor.itemsize() == slot_of(tensor).nbytes;
}

const ValuePtr& ready(Slot& slot) {
  if (slot.pending != nullptr) {
    slot.value = resolve(*slot.pending);
    slot.pending.reset();
  }
  return slot.value;
}

Source source_of(const at::TensorBase& tensor) {
  Slot& slot = slot_of(tensor);
  if (slot.pending != nullptr && !slot.pending->value) return slot.pending;
  return value_or_zeros(tensor);
}

bool is_plain(const at::TensorBase& tensor) {
  const Slot& slot = slot_of(tensor);
  return written(slot) && tensor.storage_offset() == 0 && slot.dtype == tensor.scalar_type() &&
         tensor.sizes().vec() == slot.dims && tensor.is_contiguous();
}

const ValuePtr& value_or_zeros(const at::TensorBase& tensor) {
  Slot& slot = slot_of(tensor);
  if (ready(slot) == nullptr) {
    // Zeros in the tensor's shape when it covers the storage (as the planner lays it out:
    // planner.py `_Layout`), else flat.
    auto dtype = tensor.scalar_type();
    auto itemsize = c10::elementSize(dtype);
    std::vector<int64_t> dims{static_cast<int64_t>(slot.nbytes / itemsize)};
    if (covers(tensor)) dims = tensor.sizes().vec();
    std::vector<uint8_t> zeros(slot.nbytes / itemsize * itemsize, 0);
    set_value(slot, upload(slot.device, dtype, dims, zeros.data(), zeros.size()), dims, dtype);
  }
  return slot.value;
}

at::Tensor wrap(Source value, c10::ScalarType dtype, c10::IntArrayRef sizes,
                c10::DeviceIndex device) {
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));
  at::Tensor tensor = at::detail::empty_generic(sizes, allocator(),
                                          c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype,
                                          std::nullopt);
  set_value(slot_of(tensor), std::move(value), sizes.vec(), dtype);
  return tensor;
}

void set_value(Slot& slot, Source value, std::vector<int64_t> dims, c10::ScalarType dtype) {
  slot.value = std::move(value.value);
  slot.pending = std::move(value.pending);
  slot.dims = std::move(dims);
  slot.dtype = dtype;
}

// A new allocation of `nbytes` keeping the contents it still covers (read back and written
// again: the device's values cannot change size in place). Resizing is rare but for FSDP's
// freeing of a parameter's unsharded storage (to 0 bytes) and allocating it again.
void resize_storage(const c10::Storage& storage, size_t nbytes) {
  auto* old = static_cast<Slot*>(storage.data_ptr().get_context());
  TORCH_CHECK(old != nullptr, "tpuc: resizing a storage that is not the device's");
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, old->device));
  auto fresh = allocator()->allocate(nbytes);
  auto* slot = static_cast<Slot*>(fresh.get_context());
  if (nbytes > 0 && ready(*old) != nullptr) {
    auto itemsize = c10::elementSize(old->dtype);
    TORCH_CHECK(nbytes % itemsize == 0, "tpuc: resizing a storage of ", old->dtype,
                " to a size that is no whole number of its elements");
    std::vector<uint8_t> bytes(std::max(nbytes, old->nbytes), 0);
    download(*old->value, bytes.data(), old->nbytes);
    int64_t count = static_cast<int64_t>(nbytes / itemsize);
    set_value(*slot, upload(old->device, old->dtype, {count}, bytes.data(), nbytes), {count}, old->dtype);
  }
  auto& mutable_storage = const_cast<c10::Storage&>(storage);
  mutable_storage.set_data_ptr_noswap(std::move(fresh));
  mutable_storage.set_nbytes(nbytes);
}

}  // namespace tpuc
