"""Changes tpuc makes to torch's core-ATen decomposition table: decompositions for ops torch
leaves fused, and ops whose torch decomposition tpuc does not use."""
from __future__ import annotations

import math
import sys

import torch

aten = torch.ops.aten


def flash_attention_cpu_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal,
                                 *, attn_mask=None, scale=None):
    """The gradient of CPU flash attention from its saved output and log-sum-exp (the softmax
    is recomputed, as the fused kernel does)."""
    if dropout_p != 0.0:
        return NotImplemented  # the dropout mask is not saved: keep the fused op
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    # Grouped-query attention: each key/value head serves `groups` consecutive query heads; its
    # gradients are the sums over those heads.
    kv_heads = key.shape[-3] if key.dim() >= 3 and query.dim() >= 3 else None
    groups = query.shape[-3] // kv_heads if kv_heads and query.shape[-3] != kv_heads else 1
    if groups > 1:
        key = key.repeat_interleave(groups, dim=-3)
        value = value.repeat_interleave(groups, dim=-3)
    scores = (query @ key.transpose(-2, -1)) * scale
    if is_causal:
        rows, cols = scores.shape[-2], scores.shape[-1]
        keep = torch.ones(rows, cols, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    # A fully masked row has probabilities 0 (and a log-sum-exp of 0), as in the fused kernel.
    probs = torch.exp(scores - logsumexp.unsqueeze(-1))
    grad_value = probs.transpose(-2, -1) @ grad_out
    grad_probs = grad_out @ value.transpose(-2, -1)
    delta = (grad_out * out).sum(dim=-1, keepdim=True)
    grad_scores = probs * (grad_probs - delta) * scale
    grad_query = grad_scores @ key
    grad_key = grad_scores.transpose(-2, -1) @ query
    if groups > 1:
        grad_key = grad_key.unflatten(-3, (kv_heads, groups)).sum(-3)
        grad_value = grad_value.unflatten(-3, (kv_heads, groups)).sum(-3)
    return grad_query, grad_key, grad_value


def threshold_backward(grad_output, self, threshold):
    """The gradient through threshold: zero where `self <= threshold`. Its dtype is the two
    tensors' promoted type, as torch's kernel computes it (torch's decomposition keeps the
    gradient's dtype: an integer result for an integer gradient and a float input)."""
    dtype = torch.result_type(grad_output, self)
    return torch.where(self.to(dtype) <= threshold, 0, grad_output.to(dtype))


def rrelu_with_noise_backward(grad_output, self, noise, lower, upper, training, self_is_result):
    """The gradient through rrelu: the recorded slopes in training (when the slopes were drawn
    from a range), leaky_relu's gradient at the middle slope otherwise; in the dtypes torch's
    kernel returns (torch's decomposition, outside its core table, promotes with the noise in
    evaluation too)."""
    if training and upper - lower > 1e-6:
        return grad_output * noise
    return aten.leaky_relu_backward(grad_output, self, (lower + upper) / 2, self_is_result)


def mish_backward(grad_output, self):
    """The gradient through mish, in `self`'s dtype as torch's kernel returns it (torch's
    decomposition returns the promoted type of the two)."""
    from torch._decomp.decompositions import mish_backward as torch_mish_backward

    return torch_mish_backward(grad_output.to(self.dtype), self).to(self.dtype)


def native_dropout_backward(grad_output, mask, scale):
    """The gradient through dropout: grad * mask * scale. A mask that is not boolean takes part
    in the promoted type, as in torch's kernel (torch's decomposition converts it to the
    gradient's dtype first: an integer gradient truncated it)."""
    dtype = torch.result_type(grad_output, mask)
    return grad_output.to(dtype) * (mask.to(dtype) * scale)


def _deform_corners(input, weight_shape, offset, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                    offset_groups):
    """Where each kernel tap of each output of a deformable convolution reads the input: per
    corner of the bilinear cell, the flat input position (per offset group, shaped [batch,
    groups, channels per group, points]), whether it lies inside the image, its bilinear share
    and that share's derivatives along y and x (each [batch, groups, 1, points])."""
    batch, channels, height, width = input.shape
    kernel_h, kernel_w = weight_shape[2:]
    out_h, out_w = offset.shape[-2:]
    taps = kernel_h * kernel_w
    per_group = channels // offset_groups
    points = taps * out_h * out_w
    index = dict(device=input.device)
    tap_y = torch.arange(kernel_h, **index).repeat_interleave(kernel_w) * dilation_h
    tap_x = torch.arange(kernel_w, **index).repeat(kernel_h) * dilation_w
    row = torch.arange(out_h, **index) * stride_h - pad_h
    col = torch.arange(out_w, **index) * stride_w - pad_w
    moved = offset.view(batch, offset_groups, taps, 2, out_h, out_w).to(input.dtype)
    y = (tap_y[:, None, None] + row[None, :, None]).to(input.dtype) + moved[:, :, :, 0]
    x = (tap_x[:, None, None] + col[None, None, :]).to(input.dtype) + moved[:, :, :, 1]
    y0, x0 = torch.floor(y), torch.floor(x)
    ly, lx = y - y0, x - x0
    flat = lambda t: t.reshape(batch, offset_groups, 1, points)  # noqa: E731
    corners = []
    # (dy, dx, share, d share / dy, d share / dx)
    for dy, dx, share, by_y, by_x in ((0, 0, (1 - ly) * (1 - lx), -(1 - lx), -(1 - ly)),
                                      (0, 1, (1 - ly) * lx, -lx, 1 - ly),
                                      (1, 0, ly * (1 - lx), 1 - lx, -ly),
                                      (1, 1, ly * lx, lx, ly)):
        yy, xx = y0 + dy, x0 + dx
        inside = ((yy >= 0) & (yy < height) & (xx >= 0) & (xx < width)).to(input.dtype)
        at = (yy.clamp(0, height - 1) * width + xx.clamp(0, width - 1)).long()
        at = flat(at).expand(batch, offset_groups, per_group, points)
        corners.append((at, flat(inside), flat(share), flat(by_y), flat(by_x)))
    return corners


def deform_conv2d(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                  weight_groups, offset_groups, use_mask):
    """torchvision's deformable convolution in ATen ops: each kernel tap of each output reads the
    input at its position moved by the offsets (bilinear, zero outside the image), scaled by the
    mask when `use_mask`; then a grouped product with the weight, as torchvision's CPU kernel
    computes it (its im2col columns)."""
    columns = _deform_columns(input, weight.shape, offset, mask, stride_h, stride_w, pad_h, pad_w, dilation_h,
                              dilation_w, offset_groups, use_mask)[0]
    batch, out_channels = input.shape[0], weight.shape[0]
    out_h, out_w = offset.shape[-2:]
    grouped = columns.reshape(batch, weight_groups, -1, out_h * out_w)
    kernels = weight.reshape(weight_groups, out_channels // weight_groups, -1)
    out = torch.einsum("bgkp,gok->bgop", grouped, kernels).reshape(batch, out_channels, out_h, out_w)
    return out + bias.view(1, -1, 1, 1)


def _deform_columns(input, weight_shape, offset, mask, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                    offset_groups, use_mask):
    """The im2col columns of a deformable convolution, [batch, groups, channels per group,
    points] (masked when `use_mask`), the samples before the mask, and the corners they came
    from (`_deform_corners`)."""
    batch, channels, height, width = input.shape
    corners = _deform_corners(input, weight_shape, offset, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                              offset_groups)
    planes = input.reshape(batch, offset_groups, channels // offset_groups, height * width)
    sampled = sum(torch.gather(planes, 3, at) * share * inside for at, inside, share, _, _ in corners)
    columns = sampled * mask.reshape(batch, offset_groups, 1, -1) if use_mask else sampled
    return columns, sampled, corners


def deform_conv2d_backward(grad, input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h,
                           dilation_w, weight_groups, offset_groups, use_mask):
    """The gradients of `deform_conv2d` with respect to its input, weight, offset, mask and
    bias (torchvision's `_deform_conv2d_backward`)."""
    batch, channels, height, width = input.shape
    out_channels = weight.shape[0]
    out_h, out_w = offset.shape[-2:]
    columns, sampled, corners = _deform_columns(input, weight.shape, offset, mask, stride_h, stride_w, pad_h, pad_w,
                                                dilation_h, dilation_w, offset_groups, use_mask)
    grouped = columns.reshape(batch, weight_groups, -1, out_h * out_w)
    kernels = weight.reshape(weight_groups, out_channels // weight_groups, -1)
    grad_out = grad.reshape(batch, weight_groups, out_channels // weight_groups, out_h * out_w)
    grad_weight = torch.einsum("bgop,bgkp->gok", grad_out, grouped).reshape(weight.shape)
    grad_columns = torch.einsum("bgop,gok->bgkp", grad_out, kernels).reshape(columns.shape)
    grad_bias = grad.sum((0, 2, 3))
    if use_mask:
        grad_mask = (grad_columns * sampled).sum(2).reshape(mask.shape)
        grad_sampled = grad_columns * mask.reshape(batch, offset_groups, 1, -1)
    else:
        grad_mask = torch.zeros_like(mask)
        grad_sampled = grad_columns
    planes = input.reshape(batch, offset_groups, channels // offset_groups, height * width)
    grad_planes = torch.zeros_like(planes)
    grad_y = grad_x = 0
    for at, inside, share, by_y, by_x in corners:
        grad_planes = grad_planes.scatter_add(3, at, grad_sampled * share * inside)
        reached = (grad_sampled * torch.gather(planes, 3, at) * inside).sum(2, keepdim=True)
        grad_y = grad_y + reached * by_y
        grad_x = grad_x + reached * by_x
    taps = weight.shape[2] * weight.shape[3]
    shape = (batch, offset_groups, taps, 1, out_h, out_w)
    grad_offset = torch.cat([grad_y.reshape(shape), grad_x.reshape(shape)], 3).reshape(offset.shape)
    return grad_planes.reshape(input.shape), grad_weight, grad_offset, grad_mask, grad_bias


def geometric(self, p, generator=None):
    # Drawn in float32 (float64 for float64) whatever the tensor's dtype: torch's decomposition
    # draws in the tensor's own dtype, which for an integer tensor is no uniform draw at all.
    u = torch.rand_like(self, dtype=torch.float64 if self.dtype == torch.float64 else torch.float32)
    return (torch.floor(torch.log1p(-u) / math.log1p(-p)) + 1).to(self.dtype)


EXTRA = {
    # Random fills tpuc lowers through the uniform and normal draws (docs/random.md): torch's
    # decompositions for cauchy and log_normal, tpuc's for geometric.
    **torch._decomp.get_decompositions([aten.cauchy.default, aten.log_normal.default]),
    # The form of bicubic upsampling with output sizes (the eager device's `out=` kernel; the
    # core table has the form with scale factors only).
    **torch._decomp.get_decompositions([aten.upsample_bicubic2d.default]),
    aten.geometric.default: geometric,
    aten.rrelu_with_noise_backward.default: rrelu_with_noise_backward,
    aten.mish_backward.default: mish_backward,
    aten.native_dropout_backward.default: native_dropout_backward,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: flash_attention_cpu_backward,
    aten.threshold_backward.default: threshold_backward,
}

# Ops tpuc lowers itself rather than through torch's decomposition:
# - CPU flash attention: the decomposition returns the attention probabilities where the op
#   returns the log-sum-exp of each row;
# - cross, logit and addr: the decompositions compute 16-bit floats in float32 and round once,
#   where torch's CPU kernels round after every step;
# - addcmul and addcdiv: the other way round, the decompositions round after every step where
#   the kernels compute in float32 and round once.
# tpuc's lowerings do as the kernels do.
NOT_DECOMPOSED = {
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten.linalg_cross.default,
    aten.logit.default,
    aten.addr.default,
    aten.addcmul.default,
    aten.addcdiv.default,
}


def library_extra() -> dict:
    """Decompositions of other libraries' ops, for the libraries the process has imported (a
    program calling their ops has): torchvision's deformable convolution."""
    if "torchvision" not in sys.modules:
        return {}
    return {torch.ops.torchvision.deform_conv2d.default: deform_conv2d,
            torch.ops.torchvision._deform_conv2d_backward.default: deform_conv2d_backward}
