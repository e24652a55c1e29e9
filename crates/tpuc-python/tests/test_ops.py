"""Single ops through torch.compile(backend="tpuc") in strict mode against eager: sorting,
scatters, padding, flips and the other lowerings that the models do not all reach; the backward
ops of pooling and convolution through a training step; and ops that only undecomposed
torch.export graphs contain (upsampling) through `tpuc compile` + `tpuc run`."""
import os
import subprocess

import numpy as np
import pytest
import torch
import torch._inductor.inductor_prims  # noqa: F401  (registers prims.fma)
import torch.nn as nn
import torch.nn.functional as F
from test_zoo import tpuc_binary

g = torch.Generator().manual_seed(0)


def randn(*shape):
    return torch.randn(*shape, generator=g)


x34 = randn(3, 4)
with_nan = torch.tensor([[3.0, float("nan"), -1.0, 3.0], [0.0, -0.0, 2.0, float("-inf")]])
index = torch.tensor([[0, 2, 1, 0], [2, 0, 0, 1]])

CASES = {
    "sort": (lambda x: torch.sort(x, dim=1), (x34,)),
    "sort_descending_nan_ties": (lambda x: torch.sort(x, dim=-1, descending=True, stable=True), (with_nan,)),
    "sort_nan_ties": (lambda x: torch.sort(x, stable=True), (with_nan,)),
    "argsort": (lambda x: torch.argsort(x, dim=0, stable=True), (x34,)),
    "topk": (lambda x: torch.topk(x, 2, dim=1), (x34,)),
    "topk_smallest": (lambda x: torch.topk(x, 3, dim=0, largest=False), (randn(5, 2),)),
    "scatter_src": (lambda x, i, s: x.scatter(0, i, s), (torch.zeros(3, 4), index, randn(2, 4))),
    "scatter_value": (lambda x, i: x.scatter(1, i, 2.5), (torch.zeros(2, 4), index)),
    "scatter_add": (lambda x, i, s: x.scatter_add(0, i, s), (torch.ones(3, 4), index, randn(2, 4))),
    "scatter_amax": (lambda x, i, s: x.scatter_reduce(0, i, s, "amax"), (x34, index, randn(2, 4))),
    "scatter_prod": (lambda x, i, s: x.scatter_reduce(0, i, s, "prod"), (x34, index, randn(2, 4))),
    # Inductor's fused multiply-add, in torch's optimizers' compiled steps; broadcast operands.
    "fma": (lambda a, b, c: torch.ops.prims.fma(a, b, c), (x34, randn(4), randn(3, 1))),
    "flip": (lambda x: torch.flip(x, [0, -1]), (x34,)),
    "pad": (lambda x: F.pad(x, (1, 2, 0, 1), value=-3.0), (x34,)),
    "pad_negative": (lambda x: F.pad(x, (-1, 1)), (x34,)),
    "log2_log10": (lambda x: (torch.log2(x.abs() + 1), torch.log10(x.abs() + 1)), (x34,)),
    "elu": (lambda x: (F.elu(x), F.selu(x), F.celu(x, 0.5)), (x34,)),
    "index_put": (lambda x, i, v: x.index_put((i,), v, accumulate=True), (torch.zeros(5), torch.tensor([0, 4, 0, 2]), randn(4))),
    "setitem_slice": (lambda x: (lambda y: (y.__setitem__((slice(None), slice(1, 3)), 7.0), y)[1])(x.clone()), (x34,)),
    "conv_transpose": (lambda x, w: F.conv_transpose1d(x, w, stride=2, padding=1, output_padding=1), (randn(2, 4, 5), randn(4, 3, 3))),
    "embedding_bag_mean": (lambda w, i, o: F.embedding_bag(i, w, o, mode="mean"),
                           (randn(10, 3), torch.tensor([1, 2, 4, 5, 4]), torch.tensor([0, 2]))),
    "tril_triu": (lambda x: (torch.tril(x, -1), torch.triu(x, 1)), (x34,)),
    "linspace": (lambda x: x + torch.linspace(-1, 1, 4), (x34,)),
    "group_norm": (lambda x, w, b: F.group_norm(x, 3, w, b), (randn(2, 6, 5, 4), randn(6), randn(6))),
    "batch_norm_training": (
        lambda x: F.batch_norm(x, torch.zeros(6), torch.ones(6), training=True),
        (randn(4, 6, 3),),
    ),
    "diagonal": (lambda x: (torch.diagonal(x, 1, 0, 2) * 2, torch.diagonal(x, -1, -1, 1) + 1), (randn(4, 5, 3),)),
    "as_strided": (lambda x: torch.as_strided(x + 1, (3, 2), (1, 4), 1), (x34,)),
    "masked_scatter": (lambda x, m, s: x.masked_scatter(m, s), (x34, x34 > 0, randn(12))),
    "grid_sample_bilinear": (
        lambda x, g: F.grid_sample(x, g, align_corners=False),
        (randn(2, 3, 5, 6), torch.rand(2, 4, 3, 2, generator=g) * 2.4 - 1.2),
    ),
    "grid_sample_nearest_border": (
        lambda x, g: F.grid_sample(x, g, mode="nearest", padding_mode="border", align_corners=True),
        (randn(2, 3, 5, 6), torch.rand(2, 4, 3, 2, generator=g) * 2.4 - 1.2),
    ),
    "cdist": (lambda a, b: (torch.cdist(a, b), torch.cdist(a, b, p=1), torch.cdist(a, b, p=float("inf"))),
              (randn(2, 5, 3), randn(2, 30, 3))),
    "pdist": (lambda x: (F.pdist(x), F.pdist(x, p=3)), (randn(6, 4),)),
    "max_pool_indices": (lambda x: F.max_pool2d(x, 3, 2, 1, dilation=2, return_indices=True), (randn(2, 3, 9, 11),)),
    "max_pool_indices_nan": (lambda x: F.max_pool2d(x, 2, return_indices=True),
                             (torch.where(randn(1, 2, 4, 4) > 1, float("nan"), randn(1, 2, 4, 4)),)),
    "atan2_out": (lambda a, b: torch.atan2(a, b, out=torch.empty(3, 4)), (x34, randn(3, 4))),
    "special_functions": (lambda x: (torch.lgamma(x), torch.digamma(x.abs() + 0.5), torch.erfinv(x.clamp(-0.9, 0.9)),
                                     torch.erfc(x), torch.exp2(x)), (x34,)),
    "fmax_fmin_copysign": (lambda a, b: (torch.fmax(a, b), torch.fmin(a, b), torch.copysign(a, b), torch.signbit(b),
                                         torch.ldexp(a, torch.tensor([1, -2, 0, 3]))),
                           (with_nan, torch.tensor([[1.0, 2.0, -0.0, float("nan")], [-1.0, 0.0, float("nan"), 5.0]]))),
    "var_mean": (lambda x: torch.var_mean(x, dim=1, correction=0), (x34,)),
    "addmv_addbmm_baddbmm": (lambda s, m, v, b1, b2: (torch.addmv(s, m, v, beta=0.5, alpha=2.0),
                                                     torch.addbmm(m, b1, b2, alpha=0.5),
                                                     torch.baddbmm(m, b1, b2, beta=2.0)),
                             (randn(3), x34, randn(4), randn(2, 3, 5), randn(2, 5, 4))),
    "unfold": (lambda x: x.unfold(1, 2, 1) * 2, (randn(2, 5, 3),)),
    "diagonal_scatter": (lambda x, s: torch.diagonal_scatter(x, s, 1), (x34, randn(3))),
    "searchsorted": (lambda b, v: (torch.searchsorted(b, v), torch.searchsorted(b, v, right=True)),
                     (torch.tensor([1.0, 2.0, 2.0, 5.0]), torch.tensor([[0.0, 2.0, 6.0], [2.5, 1.0, 5.0]]))),
    "scatter_reduce_mean_exclusive": (lambda x, i, s: (x.scatter_reduce(0, i, s, "mean"),
                                                       x.scatter_reduce(0, i, s, "amax", include_self=False),
                                                       x.scatter_reduce(0, i, s, "sum", include_self=False)),
                                      (x34, index, randn(2, 4))),
    "scatter_reduce_int_mean": (lambda x, i, s: x.scatter_reduce(0, i, s, "mean"),
                                (torch.arange(12).reshape(3, 4), index, torch.arange(8).reshape(2, 4) * 3)),
    "mask_assignment": (lambda x, m, v: (x.index_put((m,), torch.tensor(9.0)), x.index_put((m,), v, accumulate=True)),
                        (x34, torch.tensor([True, False, True]), randn(2, 4))),
    "nonzero_static": (lambda x: (torch.nonzero_static(x > 0, size=4), torch.nonzero_static(x > 0, size=9, fill_value=-7)), (x34,)),
    "order_statistics": (lambda x, y: (torch.median(x), torch.median(x, 1), torch.nanmedian(y, 1), torch.nanmedian(y),
                                       torch.median(y, 0), torch.kthvalue(x, 2, 0)),
                         (x34, torch.tensor([[1.0, float("nan"), 3.0, 0.5], [float("nan"), 4.0, float("nan"), -2.0],
                                             [2.0, 2.0, -1.0, 7.0]]))),
    "bucketize_angle_scatter_reduce": (lambda x, i, s: (torch.bucketize(x, torch.tensor([-1.0, 0.0, 1.0])), torch.angle(x),
                                                        x.scatter(0, i, s, reduce="multiply"), x.scatter(1, i, 2.0, reduce="add")),
                                       (x34, index, randn(2, 4))),
    "nan_propagation": (lambda x, z: (torch.maximum(x, z), torch.minimum(z, x), torch.amax(x, 1), torch.amin(x, 0),
                                      torch.max(x), F.max_pool1d(x[None], 2), torch.clamp(x, 0, 1)),
                        (with_nan, torch.zeros(2, 4))),
    "flash_attention_log_sum_exp": (lambda q, k, v: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[:2],
                                    (randn(2, 3, 4, 8), randn(2, 3, 6, 8), randn(2, 3, 6, 8))),
    "attention_fully_masked_row": (lambda q, k, v, m: (F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                                                       torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                                                           q, k, v, attn_mask=torch.where(m, 0.0, float("-inf")))[:2]),
                                   (randn(1, 2, 3, 4), randn(1, 2, 5, 4), randn(1, 2, 5, 4),
                                    torch.tensor([[True, False, True, True, False], [False] * 5, [True] * 5]))),
    "index_reduce": (lambda x, i, s: (x.index_reduce(0, i, s, "prod"), x.index_reduce(1, i[:2], s[:3, :2], "mean"),
                                      x.index_reduce(0, i, s, "amax", include_self=False),
                                      x.index_reduce(0, i, s, "amin", include_self=False)),
                     (x34, torch.tensor([2, 0, 2, 1]), randn(4, 4))),
    "view_copies": (lambda x: (torch.ops.aten.view_copy(x, [4, 3]), torch.ops.aten.permute_copy(x, [1, 0])), (x34,)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_matches_eager(name):
    fn, args = CASES[name]
    compiled = torch.compile(fn, backend="tpuc", options={"strict": True})
    torch.testing.assert_close(compiled(*args), fn(*args), equal_nan=True, atol=1e-5, rtol=1e-5)


class PoolingConvNet(nn.Module):
    """Grouped, strided, dilated convolutions and every pooling: a training step's backward
    graph holds convolution_backward and each pooling's backward op."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(6, 6, 3, padding=2, dilation=2, groups=3)
        self.norm = nn.GroupNorm(2, 6)

    def forward(self, x):
        x = self.norm(self.conv2(torch.relu(self.conv1(x))))
        a = F.max_pool2d(x, 3, 2, 1, ceil_mode=True)
        b = F.avg_pool2d(x, 3, 2, 1, count_include_pad=False)
        c = F.adaptive_avg_pool2d(x, (3, 2))
        return a.sum((2, 3)) + b.mean((2, 3)) + c.flatten(2).max(2).values


def test_pooling_and_convolution_backward_match_eager():
    torch.manual_seed(0)
    model = PoolingConvNet()
    compiled_model = PoolingConvNet()
    compiled_model.load_state_dict(model.state_dict())
    compiled = torch.compile(compiled_model, backend="tpuc", options={"strict": True})
    x = torch.randn(2, 3, 13, 11)
    for m, f in ((model, model), (compiled_model, compiled)):
        m.zero_grad()
        (f(x) ** 2).sum().backward()
    # Gradients pass through three layers and a squared loss: float32 sums in XLA's order
    # differ from torch's by up to ~2e-4 relative (measured).
    for (name, p), q in zip(model.named_parameters(), compiled_model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-4, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("layer, shape", [
    (lambda: nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1), (2, 4, 5, 6)),
    (lambda: nn.ConvTranspose1d(4, 6, 4, stride=3, groups=2, dilation=2), (2, 4, 7)),
    (lambda: nn.ConvTranspose3d(2, 2, 2, stride=2), (1, 2, 3, 2, 3)),
], ids=["strided_padded_2d", "grouped_dilated_1d", "3d"])
def test_transposed_convolution_backward_matches_eager(layer, shape):
    torch.manual_seed(0)
    model = layer()
    x = torch.randn(shape, requires_grad=True)
    compiled = torch.compile(model, backend="tpuc", options={"strict": True})
    grads = []
    for f in (model, compiled):
        out = f(x)
        grads.append(torch.autograd.grad((out * out.detach().cos()).sum(), (x, model.weight, model.bias)))
    for name, expected, actual in zip(("input", "weight", "bias"), *grads):
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_attention_backward_matches_eager():
    """Attention's backward recomputes the probabilities from the forward's log-sum-exp, with
    causal masks, additive masks and rows a mask hides entirely."""
    q, k, v = (randn(2, 2, 4, 8).requires_grad_() for _ in range(3))
    mask = torch.zeros(4, 4)
    mask[1] = float("-inf")
    mask[2, :2] = float("-inf")

    def loss(q, k, v):
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return (causal * masked).sum() + causal.square().sum()

    compiled = torch.compile(loss, backend="tpuc", options={"strict": True})
    grads = [torch.autograd.grad(f(q, k, v), (q, k, v)) for f in (loss, compiled)]
    for expected, actual in zip(*grads):
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


class GroupedQueryAttention(nn.Module):
    """Four query heads sharing two key/value heads, as Hugging Face models decode with a cache."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def test_grouped_query_attention_forward_backward_and_export(tmp_path):
    """enable_gqa reaches the backend as the CPU flash kernel with fewer key/value heads: it is
    lowered whole (no graph split, strict mode passes), its gradients match eager, and an
    export runs through `tpuc run`."""
    q = randn(1, 4, 8, 16).requires_grad_()
    k, v = (randn(1, 2, 8, 16).requires_grad_() for _ in range(2))
    model = GroupedQueryAttention()
    compiled = torch.compile(model, backend="tpuc", options={"strict": True})
    torch.testing.assert_close(compiled(q, k, v), model(q, k, v), rtol=1e-5, atol=1e-5)
    grads = [torch.autograd.grad(f(q, k, v).square().sum(), (q, k, v)) for f in (model, compiled)]
    for expected, actual, name in zip(*grads, "qkv"):
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"d{name}: {m}")

    inputs = tuple(t.detach() for t in (q, k, v))
    archive = tmp_path / "gqa.pt2"
    torch.export.save(torch.export.export(model, inputs), str(archive))
    np.savez(tmp_path / "inputs.npz", *[t.numpy() for t in inputs])
    np.savez(tmp_path / "expected.npz", model(*inputs).numpy())
    run = subprocess.run(
        [tpuc_binary(), "run", str(archive), "--input", str(tmp_path / "inputs.npz"),
         "--out", str(tmp_path / "out"), "--expect", str(tmp_path / "expected.npz")],
        capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert run.returncode == 0, run.stdout + run.stderr


class Upsampler(nn.Module):
    def forward(self, x):
        return (
            F.interpolate(x, size=(7, 9), mode="bilinear"),
            F.interpolate(x, scale_factor=1.5, mode="bilinear", align_corners=True),
            F.interpolate(x, scale_factor=2, mode="nearest"),
            F.interpolate(x, size=(5, 4), mode="nearest-exact"),
        )


def test_export_upsampling_runs_on_the_plugin(tmp_path):
    """Undecomposed export graphs keep upsample_*.vec: `tpuc compile` + `tpuc run` match eager."""
    x = randn(2, 3, 4, 6)
    program = torch.export.export(Upsampler(), (x,))
    targets = {str(n.target) for n in program.graph.nodes}
    assert {"aten.upsample_bilinear2d.vec", "aten.upsample_nearest2d.vec"} <= targets, targets
    archive = tmp_path / "up.pt2"
    torch.export.save(program, str(archive))
    np.savez(tmp_path / "inputs.npz", x.numpy())
    np.savez(tmp_path / "expected.npz", *[t.numpy() for t in Upsampler()(x)])
    run = subprocess.run(
        [tpuc_binary(), "run", str(archive), "--input", str(tmp_path / "inputs.npz"),
         "--out", str(tmp_path / "out"), "--expect", str(tmp_path / "expected.npz")],
        capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_refused_argument_names_op_argument_and_value():
    """An argument value a lowering does not handle is refused by name, never computed wrongly."""
    f = torch.compile(lambda x, g: F.grid_sample(x, g, mode="bicubic", align_corners=False),
                      backend="tpuc", options={"strict": True})
    with pytest.raises(Exception, match="not supported: grid_sampler_2d with interpolation_mode=2"):
        f(randn(1, 1, 3, 3), torch.zeros(1, 2, 2, 2))
