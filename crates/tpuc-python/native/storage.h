// The device's memory as PyTorch sees it: a storage (from the device's allocator) whose context
// is a `Slot` holding the runtime value that is the storage's contents (in fused mode, perhaps
// one a recorded run will compute: fusion.h). Values never change: writing a storage replaces
// its slot's value, which every view of the storage then reads.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>

#include "runtime.h"

namespace tpuc {

struct Pending;  // fusion.h
using PendingPtr = std::shared_ptr<Pending>;

// Contents as an op reads or writes them: a value, or one a recorded run will compute.
struct Source {
  ValuePtr value;
  PendingPtr pending;
  Source() = default;
  Source(ValuePtr v) : value(std::move(v)) {}  // NOLINT: a value is a source
  Source(PendingPtr p) : pending(std::move(p)) {}  // NOLINT
};

struct Slot {
  // The storage's contents (neither until first written: an `empty` tensor's), a dense value
  // of `dims` and `dtype` covering `nbytes`: `value`, or `pending` until its run has run.
  ValuePtr value;
  PendingPtr pending;
  std::vector<int64_t> dims;
  c10::ScalarType dtype = c10::ScalarType::Byte;
  size_t nbytes = 0;
  c10::DeviceIndex device = 0;
  // Addresses reserved for the storage (never readable): a data pointer PyTorch can compare
  // and offset, unique while the storage lives.
  void* address = nullptr;
};

c10::Allocator* allocator();

// Host memory for copies to and from the device (`pin_memory()`, DataLoader's pinned batches):
// the plugins tpuc runs on copy from any host memory, so it is ordinary memory, known as pinned
// while it lives.
c10::Allocator* pinned_allocator();
bool is_pinned(const void* address);

// The slot of a tensor of the device.
Slot& slot_of(const at::TensorBase& tensor);

// Whether a storage was written (it has a value or a pending one).
inline bool written(const Slot& slot) { return slot.value != nullptr || slot.pending != nullptr; }

// The storage's value (a pending one's run runs first); null when never written.
const ValuePtr& ready(Slot& slot);

// The storage's contents as an op reads them (fused mode reads a pending value as it is); an
// unwritten storage is first given zeros, as by `value_or_zeros`.
Source source_of(const at::TensorBase& tensor);

// Whether `tensor` lies over all of its storage, contiguously.
bool covers(const at::TensorBase& tensor);

// Whether `tensor` is its storage's whole value, in its shape and dtype.
bool is_plain(const at::TensorBase& tensor);

// The storage's value; an unwritten storage is first given zeros of the tensor's dtype (in its
// shape when it covers the storage, else flat).
const ValuePtr& value_or_zeros(const at::TensorBase& tensor);

// A new contiguous tensor of the device holding `value` (of `sizes` and `dtype`).
at::Tensor wrap(Source value, c10::ScalarType dtype, c10::IntArrayRef sizes,
                c10::DeviceIndex device);

// A tensor of the device with `tensor`'s elements that is its storage's whole value (itself
// when it is one already; else a contiguous copy).
at::Tensor dense(const at::Tensor& tensor);

// Resizes a storage of the device to `nbytes` (`resize_`, `UntypedStorage.resize_`), keeping
// the contents it still covers.
void resize_storage(const c10::Storage& storage, size_t nbytes);

// Sets a storage's contents.
void set_value(Slot& slot, Source value, std::vector<int64_t> dims, c10::ScalarType dtype);

}  // namespace tpuc
