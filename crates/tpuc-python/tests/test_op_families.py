"""Ops that returned wrong results without an error (as_strided over tensors that are not
row-major in memory, embedding bags' integer outputs, backward ops under dtype promotion) and
op families tpuc used to refuse, through torch.compile(backend="tpuc") in strict mode against
eager torch; random ops by their distributions (tpuc's generator is not torch's)."""
import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

import tpuc

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
    with pytest.raises(Exception, match="dense block of its storage") as raised:
        strict(fn)(randn(4, 6))
    # The error's kind and where it is, without reading its text.
    error = raised.value.inner_exception
    assert isinstance(error, tpuc.LoweringError) and error.op == "aten.as_strided.default"
    assert error.source.startswith(__file__) and error.node


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
    "convolution_3d": (lambda x, w: aten._convolution(x, w, None, [1, 2, 1], [0, 1, 0], [1, 1, 1], False, [0, 0, 0], 1,
                                                      False, False, True, True),
                       (randn(1, 2, 4, 5, 4), randn(3, 2, 2, 2, 2))),
    "conv_tbc": (lambda x, w, b: aten.conv_tbc(x, w, b, 1), (randn(7, 2, 3), randn(3, 3, 4), randn(4))),
    "rrelu_eval": (lambda x: F.rrelu(x, 0.1, 0.3, training=False), (x54,)),
    "upsample_nearest2d_backward": (lambda g: aten.upsample_nearest2d_backward(g, [7, 9], [2, 3, 3, 4], None, None), (randn(2, 3, 7, 9),)),
    "upsample_nearest1d_backward_scale": (lambda g: aten.upsample_nearest1d_backward(g, [10], [1, 2, 4], 2.5), (randn(1, 2, 10),)),
    "prims_reductions_and_shapes": (lambda x: (torch.ops.prims.sum(x, [1]), torch.ops.prims.prod(x, [0, 2]),
                                               torch.ops.prims.collapse(x, 0, 2), torch.ops.prims.view_of(x) + 1,
                                               torch.ops.prims.squeeze(x[:, :1], [1]), torch.ops.prims.split_dim(x, 2, 2)),
                                    (randn(2, 3, 4),)),
    "repeat_interleave_tensor_sized": (lambda x, r: torch.repeat_interleave(x, r, dim=1, output_size=7),
                                       (randn(2, 3), torch.tensor([2, 0, 5]))),
    "repeat_interleave_positions_int32": (lambda r: torch.repeat_interleave(r, output_size=6),
                                          (torch.tensor([3, 0, 1, 2], dtype=torch.int32),)),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_matches_eager(name):
    fn, args = FAMILIES[name]
    check(fn, *args, rtol=1e-4, atol=1e-4)


def test_repeat_interleave_trains_with_its_size_given():
    x = randn(2, 3).requires_grad_()
    loss = lambda x, r: torch.repeat_interleave(x, r, dim=1, output_size=7).square().sum()  # noqa: E731
    repeats = torch.tensor([2, 0, 5])
    torch.testing.assert_close(torch.autograd.grad(strict(loss)(x, repeats), x),
                               torch.autograd.grad(loss(x, repeats), x))


def test_a_size_decided_by_tensor_values_is_refused_in_strict_mode_and_run_eagerly_otherwise():
    fn = lambda x, r: x.repeat_interleave(r, dim=0) * 2  # noqa: E731
    x, repeats = randn(3, 2), torch.tensor([1, 0, 3])
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        with pytest.raises(Exception, match=r"repeat_interleave.Tensor x1 .*size \(u\d+\) depends on tensor values") as raised:
            strict(fn)(x, repeats)
        assert isinstance(raised.value.inner_exception, tpuc.UnsupportedOpsError)
        assert "aten.repeat_interleave.Tensor" in raised.value.inner_exception.ops
        torch._dynamo.reset()
        with pytest.warns(UserWarning, match="uses the size u"):
            actual = torch.compile(fn, backend="tpuc")(x, repeats)
    torch.testing.assert_close(actual, fn(x, repeats))


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


def test_adaptive_max_pooling_is_one_reduction_whatever_the_output_size(tmp_path):
    """3-d adaptive max pooling of 210 windows of two sizes per dim (with NaNs and ties) matches
    eager, and its program is as large as that of 8 windows (it was one reduction per window:
    seconds of XLA compilation per few hundred outputs)."""
    x = randn(1, 2, 10, 11, 12)
    x[0, 0, 3, 4, 5] = float("nan")
    x[0, 1, :2, :2, :2] = 7.0
    sizes = {}
    for out in ((5, 6, 7), (2, 2, 2)):
        fn = lambda x, out=out: F.adaptive_max_pool3d(x, out, return_indices=True)  # noqa: E731
        torch._dynamo.reset()
        dump = tmp_path / str(out[0])
        compiled = torch.compile(fn, backend="tpuc", options={"strict": True, "dump_dir": str(dump)})
        torch.testing.assert_close(compiled(x), fn(x), equal_nan=True)
        (module,) = dump.glob("*.mlir")
        sizes[out] = sum(1 for line in module.read_text().splitlines() if "stablehlo." in line)
    assert sizes[(5, 6, 7)] == sizes[(2, 2, 2)]


# ----- grouped matrix products and mixture-of-experts models --------------------------------

group_ends = torch.tensor([3, 7, 10], dtype=torch.int32)


@pytest.mark.parametrize("form, a, b, offs, rows", [
    ("rows by experts", randn(10, 16), randn(3, 16, 8), group_ends, 10),
    ("rows by experts, an empty group", randn(10, 16), randn(3, 16, 8), torch.tensor([0, 7, 10], dtype=torch.int32), 10),
    ("ragged depth", randn(8, 12), randn(12, 8), torch.tensor([4, 8, 12], dtype=torch.int32), None),
    ("ragged columns", randn(3, 8, 16), randn(16, 24), torch.tensor([8, 16, 24], dtype=torch.int32), None),
    ("batched", randn(3, 6, 16), randn(3, 16, 8), None, None),
])
def test_grouped_mm_matches_eager(form, a, b, offs, rows):
    fn = lambda a, b: aten._grouped_mm(a, b, offs)  # noqa: E731
    expected, actual = fn(a, b), strict(fn)(a, b)
    if rows is not None:  # torch leaves rows past the last offset uninitialized
        expected, actual = expected[:int(offs[-1])], actual[:int(offs[-1])]
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_grouped_mm_trains_and_runs_in_bfloat16():
    a, b = randn(10, 16).requires_grad_(), randn(3, 16, 8).requires_grad_()
    loss = lambda a, b: aten._grouped_mm(a, b, group_ends).square().sum()  # noqa: E731
    expected = torch.autograd.grad(loss(a, b), (a, b))
    actual = torch.autograd.grad(strict(loss)(a, b), (a, b))
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-3)
    a16, b16 = a.detach().bfloat16(), b.detach().bfloat16()
    fn = lambda a, b: aten._grouped_mm(a, b, group_ends)  # noqa: E731
    torch.testing.assert_close(strict(fn)(a16, b16), fn(a16, b16), rtol=1.6e-2, atol=1e-2)


@torch.library.custom_op("tpuc_test::scaled_gelu", mutates_args=())
def scaled_gelu(x: torch.Tensor, scale: float) -> torch.Tensor:
    return F.gelu(x) * scale


@scaled_gelu.register_fake
def _(x, scale):
    return torch.empty_like(x)


@torch.library.custom_op("tpuc_test::scaled_gelu_grad", mutates_args=())
def scaled_gelu_grad(x: torch.Tensor, grad: torch.Tensor, scale: float) -> torch.Tensor:
    return aten.gelu_backward(grad, x) * scale


@scaled_gelu_grad.register_fake
def _(x, grad, scale):
    return torch.empty_like(x)


def _save(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.scale = inputs[1]


scaled_gelu.register_autograd(lambda ctx, grad: (torch.ops.tpuc_test.scaled_gelu_grad(ctx.saved_tensors[0], grad, ctx.scale), None),
                              setup_context=_save)


@torch.library.custom_op("tpuc_test::doubled_n_times", mutates_args=())
def doubled_n_times(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    for _ in range(int(n.item())):  # reads a tensor's value on the host: not traceable
        x = x * 2
    return x.clone()


@doubled_n_times.register_fake
def _(x, n):
    return torch.empty_like(x)


def test_custom_ops_are_traced_into_aten_with_their_name_kept(tmp_path):
    """The op's implementation is traced before aot_autograd, which differentiates its ATen
    ops (the op's own backward formula is not needed)."""
    x = randn(4, 5).requires_grad_()
    fn = lambda x: torch.ops.tpuc_test.scaled_gelu(x, 1.5).square().sum()  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="tpuc", options={"strict": True, "dump_dir": str(tmp_path)})
    expected = torch.autograd.grad(fn(x), x)[0]
    actual = torch.autograd.grad(compiled(x), x)[0]
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    (forward,) = tmp_path.glob("*forward.mlir")
    assert 'loc("scaled_gelu_' in forward.read_text()


def test_an_untraceable_custom_op_is_refused_with_the_reason():
    with pytest.raises(Exception, match=r"tpuc_test.doubled_n_times.default x1 .*cannot be traced into ATen ops"):
        strict(lambda x, n: torch.ops.tpuc_test.doubled_n_times(x, n))(randn(3), torch.tensor(2))
    # Without strict mode it runs in eager torch.
    torch._dynamo.reset()
    fn = lambda x, n: torch.ops.tpuc_test.doubled_n_times(x, n) + 1  # noqa: E731
    x = randn(3)
    with pytest.warns(UserWarning):
        torch.testing.assert_close(torch.compile(fn, backend="tpuc")(x, torch.tensor(2)), x * 4 + 1)


def _moe_model(name):
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64)
    if name == "mixtral":
        config = transformers.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2)
        return transformers.MixtralForCausalLM(config)
    if name == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(**common, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                                             decoder_sparse_step=1, head_dim=8)
        return transformers.Qwen3MoeForCausalLM(config)
    config = transformers.GptOssConfig(**common, num_local_experts=4, num_experts_per_tok=2, head_dim=8,
                                       sliding_window=16, layer_types=["sliding_attention", "full_attention"])
    return transformers.GptOssForCausalLM(config)


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe", "gpt_oss"])
def test_mixture_of_experts_models_compile_whole_and_train(name):
    """Tiny Hugging Face MoE models whole in strict mode (their experts run through
    transformers' grouped product, a custom op): logits, loss and gradients as in eager."""
    torch.manual_seed(0)
    model = _moe_model(name)
    twin = _moe_model(name)
    twin.load_state_dict(model.state_dict())
    ids = torch.randint(0, 64, (2, 9), generator=g)
    model.eval(), twin.eval()
    torch._dynamo.reset()
    compiled = torch.compile(twin, backend="tpuc", options={"strict": True}, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-5)
    model.train(), twin.train()
    torch._dynamo.reset()
    compiled = torch.compile(twin, backend="tpuc", options={"strict": True}, fullgraph=True)
    expected, actual = model(ids, labels=ids).loss, compiled(ids, labels=ids).loss
    expected.backward(), actual.backward()
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    for (path, p), q in zip(model.named_parameters(), twin.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-5, msg=lambda m, path=path: f"{path}: {m}")


def test_freeze_rng_state_restores_the_hosts_and_the_devices_random_states():
    """torch's freeze_rng_state (OpInfo's random samples) saves and restores the CPU's generator
    and the accelerator's random state (the device's own: docs/random.md)."""
    from torch.testing._internal.common_utils import freeze_rng_state

    import tpuc.device  # noqa: F401  (registers torch.tpuc)

    torch.manual_seed(3)
    with freeze_rng_state():
        inside = torch.rand(4)
        on_device = torch.rand(4, device="tpuc").cpu()
    torch.testing.assert_close(torch.rand(4), inside)
    torch.testing.assert_close(torch.rand(4, device="tpuc").cpu(), on_device)


@pytest.mark.parametrize("dtype", [torch.quint8, torch.qint8, torch.qint32])
def test_quantize_per_tensor_returns_torchs_quantized_tensor(dtype):
    fn = lambda x: torch.quantize_per_tensor(x * 2, 0.1, 3, dtype)  # noqa: E731
    x = randn(5, 4) * 10
    expected, actual = fn(x), strict(fn)(x)
    assert actual.dtype == dtype and actual.q_scale() == 0.1 and actual.q_zero_point() == 3
    torch.testing.assert_close(actual.int_repr(), expected.int_repr(), rtol=0, atol=0)


def test_prims_iota():
    check(lambda x: x + torch.ops.prims.iota(4, start=2, step=3, dtype=torch.int64, device="cpu", requires_grad=False),
          torch.ones(3, 4, dtype=torch.int64))


@pytest.mark.parametrize("offset_groups, use_mask, stride, padding, dilation", [
    (1, False, 1, 0, 1),
    (2, True, (2, 1), (1, 0), (1, 2)),
])
def test_deform_conv2d_forward_and_backward_match_torchvision(offset_groups, use_mask, stride, padding, dilation):
    torchvision = pytest.importorskip("torchvision")
    x, w, b = randn(2, 4, 7, 6), randn(6, 2, 3, 2), randn(6)
    pair = lambda v: v if isinstance(v, tuple) else (v, v)  # noqa: E731
    (sh, sw), (ph, pw), (dh, dw) = pair(stride), pair(padding), pair(dilation)
    out_h, out_w = (7 + 2 * ph - dh * 2 - 1) // sh + 1, (6 + 2 * pw - dw * 1 - 1) // sw + 1
    offset = randn(2, 2 * offset_groups * 6, out_h, out_w) * 2  # some taps land outside the image
    mask = torch.rand(2, offset_groups * 6, out_h, out_w, generator=g) if use_mask else None
    fn = lambda x, o, w, b, m: torchvision.ops.deform_conv2d(x, o, w, b, stride=stride, padding=padding,  # noqa: E731
                                                             dilation=dilation, mask=m)
    check(fn, x, offset, w, b, mask, rtol=1e-5, atol=1e-5)
    inputs = [t.clone().requires_grad_() if t is not None else None for t in (x, offset, w, b, mask)]
    wanted = [t for t in inputs if t is not None]
    loss = lambda *a: fn(*a).square().sum()  # noqa: E731
    expected = torch.autograd.grad(loss(*inputs), wanted)
    actual = torch.autograd.grad(strict(loss)(*inputs), wanted)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
