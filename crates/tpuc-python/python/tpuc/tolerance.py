"""The tolerance test tpuc's debug tools share (the device's debug mode, the backend's `compare`
option): how a result differs from PyTorch's beyond a tolerance."""
from __future__ import annotations

import torch


def difference(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> str | None:
    """How `got` differs from `want` beyond the tolerance (the largest difference, or the shapes),
    None when it does not."""
    if got.shape != want.shape:
        return f"shape {list(got.shape)} against {list(want.shape)}"
    got = got.to(want.dtype)
    if want.dtype == torch.bool or not (want.is_floating_point() or want.is_complex()):
        if torch.equal(got, want):
            return None
        return f"{int((got != want).sum())} of {want.numel()} elements"
    if torch.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True):
        return None
    return str((got.double() - want.double()).abs().nan_to_num(float("inf")).max().item())
