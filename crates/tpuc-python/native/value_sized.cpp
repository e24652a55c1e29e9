// Ops whose result depends on values in a way no program on the device serves: a size with no
// bound a padded program could take, or a value returned to the host. The device computes what
// decides it, the host reads that back (as any eager accelerator does), and the result is
// composed of the device's own ops.
#include <ATen/Functions.h>
#include <torch/library.h>

namespace tpuc {
namespace {

// `bincount`: the input's range read back (one transfer), then counts (or summed weights)
// scattered into zeros of the result's size, in the result dtype torch's CPU kernel gives.
at::Tensor bincount(const at::Tensor& self, const std::optional<at::Tensor>& weights,
                    int64_t minlength) {
  TORCH_CHECK(minlength >= 0, "minlength should be >= 0");
  TORCH_CHECK(self.dim() == 1 && c10::isIntegralType(self.scalar_type(), /*includeBool=*/false),
              "bincount only supports 1-d non-negative integral inputs.");
  bool weighted = weights.has_value() && weights->defined();
  TORCH_CHECK(!weighted || (weights->dim() == 1 && weights->size(0) == self.size(0)),
              "weights should be 1-d and have the same length as input");
  int64_t length = minlength;
  at::Tensor indices = self.to(c10::kLong);
  if (self.numel() > 0) {
    auto [low, high] = at::aminmax(indices);
    at::Tensor range = at::stack({low, high}).cpu();
    const int64_t* bounds = range.const_data_ptr<int64_t>();
    TORCH_CHECK(bounds[0] >= 0, "bincount only supports 1-d non-negative integral inputs.");
    length = std::max(length, bounds[1] + 1);
  }
  if (!weighted) {
    return at::zeros({length}, self.options().dtype(c10::kLong))
        .scatter_add_(0, indices, at::ones_like(indices));
  }
  auto dtype = weights->scalar_type() == c10::kFloat ? c10::kFloat : c10::kDouble;
  return at::zeros({length}, weights->options().dtype(dtype))
      .scatter_add_(0, indices, weights->to(dtype));
}

// `equal`: whether the tensors have the same sizes and elements (NaN equals nothing), read back
// as one boolean; refused as torch's CPU kernel refuses it.
bool equal(const at::Tensor& self, const at::Tensor& other) {
  TORCH_CHECK(self.device() == other.device(), "Cannot compare two tensors on different devices. Got: ",
              self.device(), " and ", other.device());
  TORCH_CHECK(self.scalar_type() == other.scalar_type(), "Expected object of scalar type ", self.scalar_type(),
              " but got scalar type ", other.scalar_type(), " for argument 'other'");
  if (!self.is_same_size(other)) return false;
  return at::eq(self, other).all().item<bool>();
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("bincount", bincount);
  m.impl("equal", equal);
}

}  // namespace tpuc
