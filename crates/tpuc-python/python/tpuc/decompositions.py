"""Changes tpuc makes to torch's core-ATen decomposition table: decompositions for ops torch
leaves fused, and ops whose torch decomposition tpuc does not use."""
from __future__ import annotations

import math

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


EXTRA = {
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
