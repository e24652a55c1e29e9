"""Ops that returned wrong results without an error (as_strided over tensors that are not
row-major in memory, embedding bags' integer outputs, backward ops under dtype promotion) and
op families tpuc used to refuse, through torch.compile(backend="tpuc") in strict mode against
eager torch; random ops by their distributions (tpuc's generator is not torch's)."""
import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

aten = torch.ops.aten
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
g = torch.Generator().manual_seed(0)


def randn(*shape, **kw):
    return torch.randn(*shape, generator=g, **kw)


def strict(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="tpuc", options={"strict": True})


def check(fn, *args, **tolerances):
    torch.testing.assert_close(strict(fn)(*args), fn(*args), equal_nan=True, **tolerances)


# ----- as_strided addresses the storage: the input's layout decides what it reads ---------

x4 = randn(2, 3, 4, 5)


@pytest.mark.parametrize("name, fn, args", [
    ("channels_last", lambda x: torch.as_strided(x.to(memory_format=torch.channels_last) * 2, (2, 6), (1, 3), 1), (x4,)),
    ("transposed", lambda x: torch.as_strided((x * 2).t(), (3, 2), (1, 4), 1), (randn(4, 5),)),
    ("permuted", lambda x: torch.as_strided((x + 1).permute(2, 0, 1), (4, 5), (1, 4), 2), (randn(2, 3, 4),)),
    ("scatter_transposed", lambda x, s: torch.as_strided_scatter((x * 1).t(), s, (2, 2), (1, 5), 3), (randn(4, 5), randn(2, 2))),
])
def test_as_strided_reads_the_storage_order(name, fn, args):
    check(fn, *args)


def test_as_strided_over_a_view_with_gaps_is_refused_clearly():
    fn = lambda x: torch.as_strided((x * 2)[:, ::2], (2, 2), (1, 2))  # noqa: E731
    with pytest.raises(Exception, match="dense block of its storage"):
        strict(fn)(randn(4, 6))


# ----- embedding bags: every output, every mode --------------------------------------------

weight = randn(10, 3)
indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 4])
offsets = torch.tensor([0, 2, 2, 5, 9])


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("include_last", [False, True])
@pytest.mark.parametrize("padding_idx", [-1, 4])
def test_embedding_bag_outputs_match_eager(mode, include_last, padding_idx):
    """Output, offset2bag, bag_size and max_indices: empty bags, the last bag's boundary, a
    padding index."""
    fn = lambda w, i, o: aten._embedding_bag(w, i, o, False, mode, False, None, include_last, padding_idx)  # noqa: E731
    check(fn, weight, indices, offsets)


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_embedding_bag_forward_only_outputs_match_eager(mode):
    fn = lambda w, i, o: aten._embedding_bag_forward_only(w, i, o, False, mode, False, None, False, -1)  # noqa: E731
    check(fn, weight, indices, offsets)


def test_embedding_bag_max_training_matches_eager():
    w = weight.clone().requires_grad_()
    module = lambda w, i, o: F.embedding_bag(i, w, o, mode="max").square().sum()  # noqa: E731
    expected = torch.autograd.grad(module(w, indices, offsets), w)[0]
    actual = torch.autograd.grad(strict(module)(w, indices, offsets), w)[0]
    torch.testing.assert_close(actual, expected)


# ----- backward ops under dtype promotion --------------------------------------------------

@pytest.mark.parametrize("fn, args", [
    (lambda g, x: aten.threshold_backward(g, x, 0.5), (torch.randint(0, 5, (4,)), randn(4))),
    (lambda g, x: aten.threshold_backward(g, x, 0.0), (randn(4).half(), randn(4))),
    (lambda g, x: aten.mish_backward(g, x), (randn(4), randn(4).half())),
    (lambda g, m: aten.native_dropout_backward(g, m, 2.0), (torch.randint(0, 5, (4,)), randn(4))),
])
def test_backward_ops_promote_as_torch_kernels_do(fn, args):
    check(fn, *args, rtol=1e-3, atol=1e-3)


def load_audit():
    spec = importlib.util.spec_from_file_location("audit", os.path.join(ROOT, "tools", "audit_decompositions.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_decompositions_tpuc_applies_match_torch_kernels():
    """Every decomposition of tpuc's table against torch's kernel, every mix of dtypes; the
    audit itself finds torch's own table's mistakes."""
    audit = load_audit()
    assert audit.audit(audit.table()) == []
    from torch._decomp import core_aten_decompositions

    found = {op for op, _, _ in audit.audit(core_aten_decompositions(), {"aten.threshold_backward.default"})}
    assert found == {"aten.threshold_backward.default"}


# ----- families tpuc used to refuse --------------------------------------------------------

x54 = randn(5, 4)
repeated = torch.tensor([0, 2, 0, 4, 0])
mask = torch.tensor([True, False, True, False, True])

FAMILIES = {
    "index_put_impl_accumulate_repeated": (lambda x, i, v: aten._index_put_impl_(x.clone(), (i,), v, True), (x54, repeated, randn(5, 4))),
    "index_put_impl_functional": (lambda x, i, v: aten._index_put_impl(x, (i,), v, False), (x54, torch.tensor([3, 1]), randn(2, 4))),
    "index_put_impl_mask_accumulate": (lambda x, m, v: aten._index_put_impl(x, (m,), v, True), (x54, mask, randn(3, 4))),
    "index_put_impl_mask_value": (lambda x, m, v: aten._index_put_impl(x, (m,), v, False), (x54, mask, randn(4))),
    "convolution_2d": (lambda x, w, b: aten._convolution(x, w, b, [2, 1], [1, 2], [1, 2], False, [0, 0], 1, False, False, True, True),
                       (randn(2, 3, 7, 8), randn(4, 3, 3, 3), randn(4))),
    "convolution_transposed_output_padding": (
        lambda x, w, b: aten._convolution(x, w, b, [2, 2], [1, 1], [1, 1], True, [1, 0], 2, False, False, True, True),
        (randn(1, 4, 5, 5), randn(4, 3, 3, 3), randn(6))),
    "convolution_1d_groups_dilation": (lambda x, w: aten._convolution(x, w, None, [1], [0], [2], False, [0], 2, False, False, True, True),
                                       (randn(2, 4, 9), randn(6, 2, 3))),
    "convolution_3d": (lambda x, w: aten._convolution(x, w, None, [1, 2, 1], [0, 1, 0], [1, 1, 1], False, [0, 0, 0], 1, False, False, True, True),
                       (randn(1, 2, 4, 5, 4), randn(3, 2, 2, 2, 2))),
    "conv_tbc": (lambda x, w, b: aten.conv_tbc(x, w, b, 1), (randn(7, 2, 3), randn(3, 3, 4), randn(4))),
    "rrelu_eval": (lambda x: F.rrelu(x, 0.1, 0.3, training=False), (x54,)),
    "upsample_nearest2d_backward": (lambda g: aten.upsample_nearest2d_backward(g, [7, 9], [2, 3, 3, 4], None, None), (randn(2, 3, 7, 9),)),
    "upsample_nearest1d_backward_scale": (lambda g: aten.upsample_nearest1d_backward(g, [10], [1, 2, 4], 2.5), (randn(1, 2, 10),)),
    "prims_reductions_and_shapes": (lambda x: (torch.ops.prims.sum(x, [1]), torch.ops.prims.prod(x, [0, 2]),
                                               torch.ops.prims.collapse(x, 0, 2), torch.ops.prims.view_of(x) + 1,
                                               torch.ops.prims.squeeze(x[:, :1], [1]), torch.ops.prims.split_dim(x, 2, 2)),
                                    (randn(2, 3, 4),)),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_matches_eager(name):
    fn, args = FAMILIES[name]
    check(fn, *args, rtol=1e-4, atol=1e-4)


def test_conv_tbc_training_matches_eager():
    x, w, b = (t.requires_grad_() for t in (randn(6, 2, 3), randn(3, 3, 4), randn(4)))
    loss = lambda x, w, b: aten.conv_tbc(x, w, b, 1).square().sum()  # noqa: E731
    expected = torch.autograd.grad(loss(x, w, b), (x, w, b))
    actual = torch.autograd.grad(strict(loss)(x, w, b), (x, w, b))
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)


def test_rrelu_training_draws_slopes_and_differentiates():
    x = randn(64, 64).requires_grad_()
    fn = lambda x, noise: aten.rrelu_with_noise_functional(x, noise, 0.1, 0.3, True)  # noqa: E731
    y, noise = strict(fn)(x, torch.zeros_like(x))
    negative = x <= 0
    assert bool(((noise[negative] >= 0.1) & (noise[negative] <= 0.3)).all())
    assert bool((noise[~negative] == 1).all())
    torch.testing.assert_close(y, x * noise)
    assert noise[negative].std() > 0.03  # drawn, not one slope
    # The gradient is the recorded slope.
    module = lambda x: F.rrelu(x, 0.1, 0.3, training=True).sum()  # noqa: E731
    (grad,) = torch.autograd.grad(strict(module)(x), x)
    assert bool(((grad >= 0.1) & (grad <= 0.3) | (grad == 1)).all())
    assert bool((grad[~negative] == 1).all())


def test_random_ops_follow_their_distributions():
    torch.manual_seed(0)
    x = torch.zeros(200, 200)
    p = torch.full((200, 200), 0.3)
    ones, exp, normal = strict(lambda x, p: (aten.bernoulli.Tensor(x, p), aten.exponential(x, 2.0),
                                             aten.normal_functional(x, 1.0, 2.0)))(x, p)
    assert ones.dtype == x.dtype and set(ones.unique().tolist()) <= {0.0, 1.0}
    assert abs(ones.mean().item() - 0.3) < 0.01
    assert exp.min() >= 0 and abs(exp.mean().item() - 0.5) < 0.01
    assert abs(normal.mean().item() - 1.0) < 0.03 and abs(normal.std().item() - 2.0) < 0.03


def test_multinomial_draws_by_weight():
    weights = torch.tensor([[0.0, 1.0, 3.0, 0.0, 4.0], [5.0, 0.0, 0.0, 0.0, 5.0]])
    distinct = strict(lambda w: torch.multinomial(w, 2))(weights)
    assert distinct.dtype == torch.int64 and distinct.shape == (2, 2)
    assert sorted(distinct[1].tolist()) == [0, 4]  # the only two of non-zero weight
    assert distinct[0, 0] != distinct[0, 1] and set(distinct[0].tolist()) <= {1, 2, 4}
    draws = strict(lambda w: torch.multinomial(w, 20000, replacement=True))(weights[:1])
    frequency = torch.bincount(draws[0], minlength=5).float() / 20000
    torch.testing.assert_close(frequency, weights[0] / weights[0].sum(), atol=0.015, rtol=0)


def test_multinomial_without_replacement_past_the_categories_is_refused():
    with pytest.raises(Exception, match="cannot draw 6 samples without replacement"):
        strict(lambda w: torch.ops.aten.multinomial(w, 6, False))(torch.ones(5))


# ----- assertions run on the host at every call ---------------------------------------------

def test_assertions_are_checked_on_the_host():
    def fn(x):
        torch._assert_async(x.sum() > 0, "the sum must be positive")
        return x + 1

    compiled = strict(fn)
    torch.testing.assert_close(compiled(torch.ones(3)), torch.ones(3) + 1)
    with pytest.raises(RuntimeError, match="the sum must be positive"):
        compiled(-torch.ones(3))


def test_shape_assertions_are_checked_on_the_host():
    def fn(x):
        aten._assert_scalar(x.shape[0] > 2, "needs more than two rows")
        aten.sym_constrain_range(x.shape[0], min=0, max=6)
        return x * 2

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="tpuc", options={"strict": True}, dynamic=True)
    torch.testing.assert_close(compiled(torch.ones(4, 2)), torch.ones(4, 2) * 2)
    with pytest.raises(RuntimeError, match="needs more than two rows"):
        compiled(torch.ones(2, 2))
