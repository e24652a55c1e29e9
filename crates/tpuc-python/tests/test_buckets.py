"""Graphs with dynamic sizes compiled per bucket: inputs padded to the bucket, every op class that
padding would change made exact, results sliced back; checked against eager at sizes just below,
at and just above a bucket's edge, with the executables counted."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch._higher_order_ops.map import map as map_rows
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

import tpuc  # noqa: F401  (registers the backend)
from tpuc.runtime import STATS

# Sizes around the edge of the bucket 16 (default buckets: powers of two from 16).
EDGES = (15, 16, 17)


def close(a, b, tol=1e-5):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def dynamic(t: torch.Tensor, *dims: int) -> torch.Tensor:
    for d in dims:
        torch._dynamo.mark_dynamic(t, d)
    return t


def run_at_edges(fn, make, options=None):
    """`fn` compiled with tpuc and run at each size in EDGES (inputs from `make(n)`, dynamic in
    the dimensions of size n), against eager; the warnings tpuc gave."""
    compiled = torch.compile(fn, backend="tpuc", options={"strict": True, **(options or {})})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in EDGES:
            args = [dynamic(a, *[d for d, size in enumerate(a.shape) if size == n]) for a in make(n)]
            close(compiled(*args), fn(*args))
    return [str(w.message) for w in caught if "tpuc" in str(w.message)]


OP_CLASSES = {
    "elementwise": (lambda x: torch.sigmoid(x) * 2 + x.exp(), lambda n: [torch.randn(n, 3)]),
    "sum over the padded dimension": (lambda x: x.exp().sum(0), lambda n: [torch.randn(n, 3)]),
    "mean over the padded dimension": (lambda x: x.mean(-1), lambda n: [torch.randn(3, n)]),
    "max and argmax": (lambda x: (x.amax(0), x.argmax(0), x.max(dim=0).values), lambda n: [torch.randn(n, 3)]),
    "min over a padded and a whole dimension": (lambda x: x.amin((0, 1)), lambda n: [torch.randn(n, 3) + 5]),
    "softmax": (lambda x: x.softmax(-1), lambda n: [torch.randn(2, n)]),
    "log_softmax": (lambda x: F.log_softmax(x, 0), lambda n: [torch.randn(n, 2)]),
    "logsumexp": (lambda x: torch.logsumexp(x, 0), lambda n: [torch.randn(n, 2)]),
    "contraction over the padded dimension": (lambda a, b: (a.exp() @ b.exp()), lambda n: [torch.randn(4, n), torch.randn(n, 3)]),
    "batched contraction": (lambda a, b: torch.bmm(a, b.transpose(1, 2)), lambda n: [torch.randn(2, 3, n), torch.randn(2, 5, n)]),
    "cumulative sum": (lambda x: torch.cumsum(x, 0), lambda n: [torch.randn(n, 3)]),
    "layer norm of padded rows": (lambda x: F.layer_norm(x, (8,)), lambda n: [torch.randn(n, 8)]),
    "views keeping the padded dimension": (lambda x: x.view(2, -1, 4).permute(1, 0, 2).reshape(-1, 8).sum(1),
                                           lambda n: [torch.randn(2, n, 4)]),
    "linear layers over a batch of padded sequences": (
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).requires_grad_(False),
        lambda n: [torch.randn(2, n, 8)]),
    "causal attention over padded queries and keys": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        lambda n: [torch.randn(2, 2, n, 8), torch.randn(2, 2, n, 8), torch.randn(2, 2, n, 8)]),
    "concatenation along the padded dimension": (lambda x, y: torch.cat([x, y.tanh(), x * 2], 0),
                                                 lambda n: [torch.randn(n, 4), torch.randn(3, 4)]),
}


def running_state(xs, h):
    """scan over a padded leading dimension: stops at its true length (the last state is
    exact), its step reducing over a padded dimension of the state."""
    def step(h, x):
        h = torch.tanh(x + h * 0.5 + h.mean(0))
        return h, h.sum(-1)

    return scan(step, h, xs)


def halving_loop(x):
    """A loop whose carried values are padded, its condition a reduction over them."""
    def more(i, y):
        return y.abs().sum() > 1.0

    def step(i, y):
        return i + 1, y * 0.5

    return while_loop(more, step, (torch.zeros((), dtype=torch.int64), x))


def branch_on_padded_data(x):
    return torch.cond(x.sum() > 0, lambda x: x.amax(0) + x.sum(0), lambda x: x.amin(0) * 2, (x,))


# Control flow whose loop bound or operands are sizes of the bucket.
OP_CLASSES.update({
    "scan over the padded dimension": (running_state, lambda n: [torch.randn(n, 3, 4), torch.randn(3, 4)]),
    "scan along a padded batch": (running_state, lambda n: [torch.randn(5, n, 4), torch.randn(n, 4)]),
    "while_loop over padded values": (halving_loop, lambda n: [torch.randn(n, 3) * 4]),
    "cond on padded data": (branch_on_padded_data, lambda n: [torch.randn(n, 3)]),
    "map over padded rows": (lambda xs: map_rows(lambda x: x.softmax(0), xs), lambda n: [torch.randn(n, 5)]),
})


@pytest.mark.parametrize("name", list(OP_CLASSES))
def test_each_op_class_is_exact_around_a_bucket_edge(name):
    fn, make = OP_CLASSES[name]
    compiles = STATS["compiles"]
    assert run_at_edges(fn, make) == []
    # 15 and 16 share the bucket 16; 17 is in 32.
    assert STATS["compiles"] - compiles == 2


def test_attention_masks_keys_beyond_the_true_length():
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    def make(n):
        return [torch.randn(1, 2, 1, 8), torch.randn(1, 2, n, 8), torch.randn(1, 2, n, 8)]

    compiled = torch.compile(attend, backend="tpuc", options={"strict": True})
    for n in EDGES:
        q, k, v = make(n)
        k, v = dynamic(k, 2), dynamic(v, 2)
        close(compiled(q, k, v), attend(q, k, v))


def test_a_decoding_cache_grows_through_buckets():
    """The shape of a decoding step: a cache concatenated with the new key, attended over,
    returned grown by one; its true size feeds the next step."""
    def step(cache, new, q):
        cache = torch.cat([cache, new], dim=2)
        return F.scaled_dot_product_attention(q, cache, cache), cache

    compiled = torch.compile(step, backend="tpuc", options={"strict": True})
    cache = torch.randn(1, 2, 3, 8)
    eager = cache.clone()
    compiles = STATS["compiles"]
    for _ in range(40):
        new, q = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
        out, cache = compiled(dynamic(cache, 2), new, q)
        want, eager = step(eager, new, q)
        close(out, want)
        assert cache.shape == eager.shape
        close(cache, eager)
    # Sizes 3..42: the static first graph, then the buckets 16, 32, 64.
    assert STATS["compiles"] - compiles <= 4


def test_executables_grow_with_the_log_of_the_sizes():
    f = torch.compile(lambda x: x.softmax(0).cumsum(0) * 3, backend="tpuc", options={"buckets": "pow2:2"})
    compiles, hits = STATS["compiles"], STATS["bucket_hits"]
    for n in range(2, 129):
        x = dynamic(torch.randn(n, 2), 0)
        close(f(x), x.softmax(0).cumsum(0) * 3)
    # 2, 4, 8, ..., 128: 7 buckets for 127 sizes.
    assert STATS["compiles"] - compiles == 7
    assert STATS["bucket_hits"] - hits == 127 - 7


def test_buckets_from_a_list_and_off():
    fn = lambda x: x.sum(0)  # noqa: E731
    f = torch.compile(fn, backend="tpuc", options={"buckets": [8, 64]})
    compiles = STATS["compiles"]
    for n in (3, 8, 9, 64, 65):
        x = dynamic(torch.randn(n, 2), 0)
        close(f(x), fn(x))
    # 3 and 8 in 8; 9 and 64 in 64; 65 above the list, its own size.
    assert STATS["compiles"] - compiles == 3
    torch._dynamo.reset()
    g = torch.compile(fn, backend="tpuc", options={"buckets": "off"})
    compiles = STATS["compiles"]
    for n in (3, 4, 5):
        x = dynamic(torch.randn(n, 2), 0)
        close(g(x), fn(x))
    assert STATS["compiles"] - compiles == 3


def test_an_op_padding_would_change_is_compiled_per_size_said_once():
    fn = lambda x: x.flip(0) * 2 + x[-1]  # noqa: E731
    messages = run_at_edges(fn, lambda n: [torch.randn(n, 3)])
    assert len(messages) == 1, messages
    assert "compiled for each size" in messages[0] and "cannot be padded" in messages[0], messages[0]


@pytest.mark.parametrize("bad", ["pow2:0", "8,4", "sixteen", 3.5, [4, "x"]])
def test_bad_bucket_options_are_refused_naming_them(bad):
    with pytest.raises(ValueError, match="buckets"):
        tpuc.Options.parse({"buckets": bad})


def test_sizes_a_graph_returns_are_computed_on_the_host():
    """A counter passed as an integer and returned incremented (as Mistral's sliding-window
    cache keeps its length) does not stop the graph from being compiled per bucket."""
    def step(x, seen):
        return x.softmax(0) * 2, seen + 1

    f = torch.compile(step, backend="tpuc", options={"strict": True}, dynamic=True)
    compiles = STATS["compiles"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (15, 16, 17, 30):
            x = torch.randn(n, 3)
            out, seen = f(x, n * 10)
            close(out, x.softmax(0) * 2)
            assert seen == n * 10 + 1
    assert STATS["compiles"] - compiles == 2


def test_padded_inputs_may_be_strided_and_results_are_contiguous():
    fn = lambda x: x.softmax(1) * 2  # noqa: E731
    f = torch.compile(fn, backend="tpuc", options={"strict": True})
    for n in EDGES:
        x = dynamic(torch.randn(n, 6).t(), 1)  # (6, n), not contiguous
        out = f(x)
        close(out, fn(x))
        assert out.is_contiguous() and out.shape == (6, n)


def test_the_runtime_refuses_host_memory_that_does_not_fit():
    from tpuc import _tpuc

    x = torch.arange(6, dtype=torch.float32)
    with pytest.raises(tpuc.TpucError, match="24 bytes given"):
        _tpuc.HostInput(x.data_ptr(), 24, "float32", [2, 2], x)
    with pytest.raises(tpuc.TpucError, match="24 bytes given"):
        _tpuc.HostInput(x.data_ptr(), 24, "float32", [-1, 6], x)


def test_results_copied_out_are_sliced_to_their_true_sizes():
    """An empty result keeps the outputs from aliasing the plugin's memory: they are copied into
    new tensors, each at its true size."""
    fn = lambda x: (x.softmax(0) * 2, x[:, :0] + 1)  # noqa: E731
    f = torch.compile(fn, backend="tpuc", options={"strict": True})
    for n in EDGES:
        x = dynamic(torch.randn(n, 3), 0)
        (a, b), (want_a, want_b) = f(x), fn(x)
        close(a, want_a)
        assert b.shape == want_b.shape


def test_the_next_bucket_compiles_ahead_while_a_sequence_grows():
    """Once a growing size has moved into a larger bucket, the bucket after it compiles in the
    background: 8..70 takes the buckets 16 and 32 in the foreground, and finds 64 and 128
    compiled ahead; every step as in eager."""
    weight = torch.randn(16, 16)

    def step(q, keys):
        return (keys @ (q @ weight)[:, None]).softmax(0).T @ keys

    compiled = torch.compile(step, backend="tpuc", options={"cache_dir": "off"})
    keys, q = torch.randn(8, 16), torch.randn(16)
    compiles, ahead = STATS["compiles"], STATS["compiled_ahead"]
    while keys.shape[0] < 70:
        torch._dynamo.mark_dynamic(keys, 0)
        out = compiled(q, keys)
        torch.testing.assert_close(out, step(q, keys), rtol=1e-5, atol=1e-5)
        q, keys = out[0], torch.cat([keys, out])
    assert STATS["compiles"] - compiles == 4
    assert STATS["compiled_ahead"] - ahead == 2
