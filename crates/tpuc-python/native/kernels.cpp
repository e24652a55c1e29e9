// The ATen kernels the device has of its own, which need no program: factories (storage from the
// device's allocator), views (the same storage, another layout), copies between the host and
// the device, resizing, reading one number. Every other op takes the boxed path (ops.cpp).
#include <ATen/EmptyTensor.h>
#include <ATen/Functions.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <c10/core/DeviceGuard.h>

#include <cstring>
#include <torch/library.h>

#include "ops.h"
#include "storage.h"

namespace tpuc {
namespace {

constexpr auto kKeySet = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);

c10::DeviceIndex index_of(std::optional<c10::Device> device) {
  if (device && device->has_index()) return device->index();
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)->getDevice().index();
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, index_of(device)));
  return at::detail::empty_generic(size, allocator(), kKeySet,
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, index_of(device)));
  return at::detail::empty_strided_generic(size, stride, allocator(), kKeySet,
                                           c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  return at::native::view(self, size);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

// A device tensor with its conjugate and negative bits applied (PyTorch's lazy conj() and
// neg views), computed by the device's own ops.
at::Tensor resolved(const at::Tensor& tensor) {
  at::Tensor out = tensor;
  if (out.is_conj()) {
    out = call("aten::conj_physical", "", {at::_conj(out)})[0].toTensor();
  }
  if (out.is_neg()) {
    out = call("aten::neg", "", {at::_neg_view(out)})[0].toTensor();
  }
  return out;
}

at::Tensor copy_from(const at::Tensor& source, const at::Tensor& dst, bool non_blocking) {
  // `_copy_from` takes tensors with their conjugate and negative bits as they are (the math-op
  // fallbacks pass it through, below): a copy would otherwise materialize them by copying.
  const at::Tensor self = source.device().type() == c10::DeviceType::PrivateUse1
                              ? resolved(source)
                              : source.resolve_conj().resolve_neg();
  bool from_device = self.device().type() == c10::DeviceType::PrivateUse1;
  bool to_device = dst.device().type() == c10::DeviceType::PrivateUse1;
  if (from_device && !to_device) {
    auto source = dense(self);
    auto host = at::empty(self.sizes(), self.options().device(c10::kCPU));
    download(*ready(slot_of(source)), host.data_ptr(), host.nbytes());
    dst.copy_(host, non_blocking);
    return dst;
  }
  if (!from_device && to_device) {
    auto host = self.to(dst.scalar_type()).expand(dst.sizes()).contiguous();
    auto value = upload(dst.device().index(), host.scalar_type(), host.sizes().vec(),
                        host.data_ptr(), host.nbytes());
    if (covers(dst)) {
      set_value(slot_of(dst), std::move(value), dst.sizes().vec(), dst.scalar_type());
      return dst;
    }
    auto staged = wrap(std::move(value), host.scalar_type(), host.sizes(), dst.device().index());
    call("aten::copy_", "", {dst, staged, non_blocking});
    return dst;
  }
  TORCH_CHECK(from_device && to_device, "tpuc: _copy_from without a tensor of the device");
  if (self.device() != dst.device()) {
    // Between two devices of the plugin: through the host.
    auto host = at::empty(self.sizes(), self.options().device(c10::kCPU));
    auto source = dense(self);
    download(*ready(slot_of(source)), host.data_ptr(), host.nbytes());
    return copy_from(host, dst, non_blocking);
  }
  call("aten::copy_", "", {dst, self, non_blocking});
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

// Storages up to this size are read whole for one element of theirs (below).
constexpr size_t kReadWholeBytes = 1 << 20;

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  auto host = at::empty({}, self.options().device(c10::kCPU));
  // An element of a small storage is picked from the storage read whole: a view's element
  // read through a program would compile one per offset, and iterating a tensor reads each.
  auto& slot = slot_of(self);
  size_t offset = static_cast<size_t>(self.storage_offset()) * self.itemsize();
  if (!self.is_conj() && !self.is_neg() && slot.nbytes <= kReadWholeBytes &&
      offset + self.itemsize() <= slot.nbytes && ready(slot) != nullptr) {
    std::vector<uint8_t> bytes(slot.nbytes);
    download(*slot.value, bytes.data(), slot.nbytes);
    std::memcpy(host.data_ptr(), bytes.data() + offset, self.itemsize());
    return host.item();
  }
  auto source = dense(self.reshape({}));
  download(*ready(slot_of(source)), host.data_ptr(), host.nbytes());
  return host.item();
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  size_t needed = at::detail::computeStorageNbytesContiguous(size, self.itemsize(),
                                                             self.storage_offset());
  if (needed > self.storage().nbytes()) resize_storage(self.storage(), needed);
  impl->set_sizes_contiguous(size);
  if (memory_format && *memory_format != c10::MemoryFormat::Preserve) {
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

// `set_.source_Storage_storage_offset`: `self` over `source` at `offset`, laid out by `size` and
// `stride` (contiguous when empty); a storage too small for that grows.
at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  at::native::checkSetStorage(self, source, offset, size, stride);
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_offset(offset);
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
  } else {
    impl->set_sizes_and_strides(size, stride);
  }
  size_t needed = at::detail::computeStorageNbytes(self.sizes(), self.strides(), self.itemsize(),
                                                   static_cast<size_t>(offset));
  if (needed > self.storage().nbytes()) resize_storage(self.storage(), needed);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  int64_t count = static_cast<int64_t>(source.nbytes() / self.itemsize());
  return set_storage(self, std::move(source), 0, {count}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(),
                     source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, allocator(), true);
  return set_storage(self, std::move(storage), 0, {0}, {});
}

// Whether `from` may replace `self`'s data in place (`param.data = from`, which `Module.to()`
// does, keeping a Parameter's identity and so the weights tied to it): dense tensors of the host
// and the device, as the CPU's and CUDA's are to each other.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& tensor) {
    auto type = tensor.device().type();
    return tensor.layout() == c10::kStrided && !tensor.is_quantized() &&
           (type == c10::DeviceType::PrivateUse1 || type == c10::DeviceType::CPU);
  };
  return dense(self) && dense(from);
}

}  // namespace

at::Tensor dense(const at::Tensor& tensor) {
  if (is_plain(tensor)) return tensor;
  return call("aten::clone", "", {tensor, c10::MemoryFormat::Contiguous})[0].toTensor();
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
  // Convolutions reach a backend other than the CPU's and CUDA's as these two, which the
  // planner takes as `convolution` and `convolution_backward`.
  // Indexing takes the boxed path as it is called: a boolean mask then reaches the planner
  // (which pads the result), not torch's expansion of it into a nonzero of another size.
  m.impl("index.Tensor", torch::CppFunction::makeFromBoxedFunction<&run_op>());
  // Layer and group norm whole, as the CPU computes them (in float32, rounded once): their
  // composite kernel for other devices normalizes with batch norm and applies the weight and
  // bias in a separate op, rounding 16-bit floats in between.
  m.impl("native_layer_norm", torch::CppFunction::makeFromBoxedFunction<&run_op>());
  m.impl("native_group_norm", torch::CppFunction::makeFromBoxedFunction<&run_op>());
  m.impl("convolution_overrideable", torch::CppFunction::makeFromBoxedFunction<&run_op>());
  m.impl("convolution_backward_overrideable", torch::CppFunction::makeFromBoxedFunction<&run_op>());
}

// Conjugate and negative views reach `_copy_from` as they are (`copy_from` resolves them): their
// fallbacks would copy to materialize them, which is this copy again.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&run_op>());
}

}  // namespace tpuc

namespace at::native {
// scaled_dot_product_attention picks its kernel as on the CPU (torch's own rule, which honours
// `sdpa_kernel`): the CPU's flash kernel where the arguments allow it, one op the device plans
// once per shapes, else the math composite. Without a choice for the device it is always the
// composite: nine ops, each compiled anew for every length of a growing key-value cache.
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &_fused_sdp_choice_cpp)
}  // namespace at::native
