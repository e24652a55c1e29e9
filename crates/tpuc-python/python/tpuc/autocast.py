"""Autocast on the tpuc device: `torch.autocast("tpuc", dtype=torch.bfloat16)` with CUDA's policy.
Matmuls and convolutions run in the low type; ops that need range or precision (reductions,
norms, losses, exponentials, softmax) run in float32; ops of several operands that must agree
run in their widest type; every other op runs as it is.

PyTorch routes an op on the device through the `AutocastPrivateUse1` dispatch key while autocast
is on for the device: every op falls through it, and the ops of the lists below get a kernel that
casts their floating-point tensor arguments on the device, then calls the op again below
autocast.
"""
from __future__ import annotations

import torch

from .accelerator import NAME

KEY = "AutocastPrivateUse1"
# What an autocast kernel calls the op below.
_BELOW_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

# CUDA's autocast lists (aten/src/ATen/autocast_mode.cpp), by the ATen name each kernel is
# registered for (every overload of the name).
LOWER_PRECISION = (
    "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr",
    "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm",
    "chain_matmul", "linalg_multi_dot", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "scaled_dot_product_attention",
)
FLOAT32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm",
    "group_norm", "frobenius_norm", "nuclear_norm", "cosine_similarity", "poisson_nll_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss",
    "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "upsample_linear1d",
    "upsample_bilinear2d", "upsample_trilinear3d", "upsample_bicubic2d", "cumprod", "cumsum",
    "prod", "sum", "softmax", "log_softmax", "cross_entropy_loss", "norm",
)
WIDEST = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler", "index_put",
    "scatter_add", "tensordot",
)


def _on_device(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == NAME and value.is_floating_point()


def _cast(value, dtype: torch.dtype):
    if _on_device(value) and value.dtype != dtype:
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _widest(args, kwargs) -> torch.dtype | None:
    """The widest floating type among the device tensors of `args` and `kwargs`."""
    found = None
    for value in [*args, *kwargs.values()]:
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if _on_device(v):
                found = v.dtype if found is None else torch.promote_types(found, v.dtype)
    return found


def _kernel(op, policy: str):
    def run(*args, **kwargs):
        if policy == "lower":
            dtype = torch.get_autocast_dtype(NAME)
        elif policy == "float32":
            dtype = torch.float32
        else:
            dtype = _widest(args, kwargs)
        if dtype is not None:
            args, kwargs = _cast(args, dtype), {k: _cast(v, dtype) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(_BELOW_AUTOCAST):
            return op(*args, **kwargs)

    return run


_LIBRARIES: list = []


def register() -> None:
    """Registers the fallthrough and the kernels (once per process)."""
    if _LIBRARIES:
        return
    every = torch.library.Library("_", "IMPL")
    every.fallback(torch.library.fallthrough_kernel, KEY)
    aten = torch.library.Library("aten", "IMPL")
    for names, policy in ((LOWER_PRECISION, "lower"), (FLOAT32, "float32"), (WIDEST, "widest")):
        for name in names:
            packet = getattr(torch.ops.aten, name, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                op = getattr(packet, overload)
                aten.impl(op, _kernel(op, policy), KEY)
    _LIBRARIES.extend([every, aten])
