"""Single ops through torch.compile(backend="tpuc") in strict mode against eager: sorting,
scatters, padding, flips and the other lowerings that the models do not all reach."""
import pytest
import torch
import torch.nn.functional as F

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
    "flip": (lambda x: torch.flip(x, [0, -1]), (x34,)),
    "pad": (lambda x: F.pad(x, (1, 2, 0, 1), value=-3.0), (x34,)),
    "pad_negative": (lambda x: F.pad(x, (-1, 1)), (x34,)),
    "log2_log10": (lambda x: (torch.log2(x.abs() + 1), torch.log10(x.abs() + 1)), (x34,)),
    "elu": (lambda x: (F.elu(x), F.selu(x), F.celu(x, 0.5)), (x34,)),
    "index_put": (lambda x, i, v: x.index_put((i,), v, accumulate=True), (torch.zeros(5), torch.tensor([0, 4, 0, 2]), randn(4))),
    "setitem_slice": (lambda x: (lambda y: (y.__setitem__((slice(None), slice(1, 3)), 7.0), y)[1])(x.clone()), (x34,)),
    "conv_transpose": (lambda x, w: F.conv_transpose1d(x, w, stride=2, padding=1, output_padding=1), (randn(2, 4, 5), randn(4, 3, 3))),
    "embedding_bag_mean": (lambda w, i, o: F.embedding_bag(i, w, o, mode="mean"), (randn(10, 3), torch.tensor([1, 2, 4, 5, 4]), torch.tensor([0, 2]))),
    "tril_triu": (lambda x: (torch.tril(x, -1), torch.triu(x, 1)), (x34,)),
    "linspace": (lambda x: x + torch.linspace(-1, 1, 4), (x34,)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_matches_eager(name):
    fn, args = CASES[name]
    compiled = torch.compile(fn, backend="tpuc", options={"strict": True})
    torch.testing.assert_close(compiled(*args), fn(*args), equal_nan=True)
