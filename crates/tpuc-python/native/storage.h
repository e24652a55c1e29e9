// The device's memory as PyTorch sees it: a storage (from the device's allocator) whose context
// is a `Slot` holding the runtime value that is the storage's contents. Values never change:
// writing a storage replaces its slot's value, which every view of the storage then reads.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>

#include "runtime.h"

namespace tpuc {

struct Slot {
  // The storage's contents (null until first written: an `empty` tensor's), a dense value of
  // `dims` and `dtype` covering `nbytes`.
  ValuePtr value;
  std::vector<int64_t> dims;
  c10::ScalarType dtype = c10::ScalarType::Byte;
  size_t nbytes = 0;
  c10::DeviceIndex device = 0;
  // Addresses reserved for the storage (never readable): a data pointer PyTorch can compare
  // and offset, unique while the storage lives.
  void* address = nullptr;
};

c10::Allocator* allocator();

// The slot of a tensor of the device.
Slot& slot_of(const at::TensorBase& tensor);

// Whether `tensor` is its storage's whole value, in its shape and dtype.
bool is_plain(const at::TensorBase& tensor);

// The storage's value; an unwritten storage is first given zeros of its size in `dtype`.
const ValuePtr& value_or_zeros(const at::TensorBase& tensor);

// A new contiguous tensor of the device holding `value` (of `sizes` and `dtype`).
at::Tensor wrap(ValuePtr value, c10::ScalarType dtype, c10::IntArrayRef sizes,
                c10::DeviceIndex device);

// A tensor of the device with `tensor`'s elements that is its storage's whole value (itself
// when it is one already; else a contiguous copy).
at::Tensor dense(const at::Tensor& tensor);

// Sets a storage's contents.
void set_value(Slot& slot, ValuePtr value, std::vector<int64_t> dims, c10::ScalarType dtype);

}  // namespace tpuc
