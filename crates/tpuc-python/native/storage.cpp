#include "storage.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <sys/mman.h>

#include <vector>

namespace tpuc {
namespace {

void release(void* context) {
  auto* slot = static_cast<Slot*>(context);
  if (slot->address != nullptr) munmap(slot->address, slot->nbytes);
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
      void* address = mmap(nullptr, nbytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                           -1, 0);
      if (address == MAP_FAILED) {
        delete slot;
        TORCH_CHECK(false, "tpuc: no address space left for a tensor of ", nbytes, " bytes");
      }
      slot->address = address;
    }
    return {slot->address, slot, &release, c10::Device(c10::DeviceType::PrivateUse1, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    TORCH_CHECK(false, "tpuc: the device's memory is not addressable; copy tensors with copy_");
  }
};

Allocator g_allocator;
}  // namespace

c10::Allocator* allocator() { return &g_allocator; }

Slot& slot_of(const at::TensorBase& tensor) {
  const auto& data = tensor.storage().data_ptr();
  TORCH_CHECK(data.get_deleter() == &release,
              "tpuc: a tensor of the tpuc device whose storage the device did not allocate");
  return *static_cast<Slot*>(data.get_context());
}

bool is_plain(const at::TensorBase& tensor) {
  const Slot& slot = slot_of(tensor);
  return slot.value != nullptr && tensor.storage_offset() == 0 && slot.dtype == tensor.scalar_type() &&
         tensor.sizes().vec() == slot.dims && tensor.is_contiguous();
}

const ValuePtr& value_or_zeros(const at::TensorBase& tensor) {
  Slot& slot = slot_of(tensor);
  if (slot.value == nullptr) {
    auto dtype = tensor.scalar_type();
    auto itemsize = c10::elementSize(dtype);
    int64_t count = static_cast<int64_t>(slot.nbytes / itemsize);
    std::vector<uint8_t> zeros(static_cast<size_t>(count) * itemsize, 0);
    set_value(slot, upload(slot.device, dtype, {count}, zeros.data(), zeros.size()), {count}, dtype);
  }
  return slot.value;
}

at::Tensor wrap(ValuePtr value, c10::ScalarType dtype, c10::IntArrayRef sizes,
                c10::DeviceIndex device) {
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));
  at::Tensor tensor = at::detail::empty_generic(sizes, allocator(),
                                          c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype,
                                          std::nullopt);
  set_value(slot_of(tensor), std::move(value), sizes.vec(), dtype);
  return tensor;
}

void set_value(Slot& slot, ValuePtr value, std::vector<int64_t> dims, c10::ScalarType dtype) {
  slot.value = std::move(value);
  slot.dims = std::move(dims);
  slot.dtype = dtype;
}

}  // namespace tpuc
