"""Quantized programs against eager torch: models quantized with PT2E (torchao's X86 quantizer)
exported and run through `tpuc compile` + `tpuc run` and through torch.compile, and the
quantization ops one by one (quantize/dequantize per tensor and per channel, fake quantization
and its gradient, the integer matmuls), bad arguments included."""
import os
import subprocess

import numpy as np
import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401 - defines the quantized_decomposed ops
import torch.nn as nn
from models import DecoderBlock
from test_zoo import tpuc_binary

qd = torch.ops.quantized_decomposed


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 16, 3, stride=2)
        self.fc = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x):
        x = torch.relu(self.c1(x))
        x = nn.functional.max_pool2d(x, 2)
        x = torch.relu(self.c2(x))
        return self.fc(x.flatten(1))


def pt2e_quantized(model, example, calibration):
    """The model quantized as PT2E does it: exported, observed on calibration data, converted."""
    pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
    x86 = pytest.importorskip("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer")
    quantizer = x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config())
    prepared = pt2e.prepare_pt2e(torch.export.export(model.eval(), (example,)).module(), quantizer)
    for batch in calibration:
        prepared(batch)
    return pt2e.convert_pt2e(prepared)


QUANTIZED_MODELS = {
    "cnn": (SmallCNN, lambda: torch.randn(2, 3, 32, 32)),
    "llama_block": (lambda: DecoderBlock(32, 4, 2, 64), lambda: torch.randn(2, 8, 32)),
}


@pytest.fixture(scope="module", params=list(QUANTIZED_MODELS))
def quantized(request):
    torch.manual_seed(0)
    make_model, make_input = QUANTIZED_MODELS[request.param]
    converted = pt2e_quantized(make_model(), make_input(), [make_input() for _ in range(4)])
    ops = {str(n.target) for n in converted.graph.nodes if n.op == "call_function"}
    assert "quantized_decomposed.quantize_per_tensor.default" in ops, ops
    return request.param, converted, make_input


def test_a_pt2e_model_runs_through_tpuc_compile_and_run(quantized, tmp_path):
    name, converted, make_input = quantized
    x = make_input()
    with torch.no_grad():
        want = converted(x)
    archive = tmp_path / f"{name}.pt2"
    torch.export.save(torch.export.export(converted, (x,)), archive)
    np.save(tmp_path / "x.npy", x.numpy())
    tpuc_cli = tpuc_binary()
    compiled = subprocess.run([tpuc_cli, "compile", str(archive), "-o", str(tmp_path / "m.mlir")],
                              capture_output=True, text=True, cwd=tmp_path)
    assert compiled.returncode == 0, compiled.stderr
    assert "i8" in (tmp_path / "m.mlir").read_text()
    run = subprocess.run([tpuc_cli, "run", str(archive), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "out")],
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    got = torch.from_numpy(np.load(tmp_path / "out" / "out0.npy"))
    # The same integers as torch's: a difference beyond float rounding would be a quantization
    # step (scale ~1e-2), far above this bound.
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_a_pt2e_model_runs_through_the_backend(quantized):
    name, converted, make_input = quantized
    compiled = torch.compile(converted, backend="tpuc", options={"strict": True})
    for _ in range(2):
        x = make_input()
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), converted(x), rtol=1e-4, atol=1e-5)


def compiled_strict(fn):
    return torch.compile(fn, backend="tpuc", options={"strict": True}, dynamic=False)


def test_quantize_and_dequantize_per_tensor_match_torch():
    # Values on the rounding ties and beyond the bounds.
    x = torch.cat([torch.randn(64) * 4, torch.tensor([0.25, 0.75, -0.25, 1.25, 100.0, -100.0])])
    for dtype, lo, hi in [(torch.int8, -128, 127), (torch.uint8, 0, 255), (torch.int32, -1000, 1000)]:
        def roundtrip(v, dtype=dtype, lo=lo, hi=hi):
            q = qd.quantize_per_tensor(v, 0.5, 3, lo, hi, dtype)
            return q, qd.dequantize_per_tensor(q, 0.5, 3, lo, hi, dtype)

        got, want = compiled_strict(roundtrip)(x), roundtrip(x)
        assert got[0].dtype == dtype and torch.equal(got[0], want[0]), dtype
        torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)


def test_tensor_qparams_forms_match_torch():
    x = torch.randn(4, 8) * 3
    scale, zp = torch.tensor(0.037, dtype=torch.float64), torch.tensor(-5)
    lo, hi = torch.tensor(-128), torch.tensor(127)

    def fn(v):
        q = qd.quantize_per_tensor.tensor(v, scale, zp, -128, 127, torch.int8)
        q2 = qd.quantize_per_tensor.tensor2(v, scale, zp, lo, hi, torch.int8)
        return q, q2, qd.dequantize_per_tensor.tensor(q, scale, zp, -128, 127, torch.int8, out_dtype=torch.bfloat16)

    for got, want in zip(compiled_strict(fn)(x), fn(x)):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_per_channel_quantization_matches_torch():
    w = torch.randn(6, 5, 3)
    for axis, scale_dtype in [(0, torch.float32), (1, torch.float64), (-1, torch.float32)]:
        channels = w.shape[axis]
        scales = (torch.rand(channels) * 0.1 + 0.01).to(scale_dtype)
        zps = torch.randint(-3, 4, (channels,))

        def fn(v, scales=scales, zps=zps, axis=axis):
            q = qd.quantize_per_channel(v, scales, zps, axis % 3, -128, 127, torch.int8)
            return q, qd.dequantize_per_channel(q, scales, zps, axis % 3, -128, 127, torch.int8), \
                qd.dequantize_per_channel(q, scales, None, axis % 3, -128, 127, torch.int8)

        for got, want in zip(compiled_strict(fn)(w), fn(w)):
            assert got.dtype == want.dtype, (axis, got.dtype, want.dtype)
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_fake_quantization_and_its_gradient_match_torch():
    x = (torch.randn(4, 6) * 2).requires_grad_()
    scale_t, zp_t = torch.tensor([0.1]), torch.tensor([2], dtype=torch.int32)
    ch_scale, ch_zp = torch.rand(6) * 0.2 + 0.05, torch.randint(-2, 3, (6,), dtype=torch.int32)

    def fn(v):
        a = torch.fake_quantize_per_tensor_affine(v, 0.1, 2, -8, 7)
        b = torch.fake_quantize_per_tensor_affine(v, scale_t, zp_t, -8, 7)
        c = torch.fake_quantize_per_channel_affine(v, ch_scale, ch_zp, 1, -8, 7)
        return (a * 1.5 + b * 0.5 + c).sum()

    got = compiled_strict(fn)(x)
    (got_grad,) = torch.autograd.grad(got, x)
    want = fn(x)
    (want_grad,) = torch.autograd.grad(want, x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=0)


def test_fake_quantization_with_cachemask_and_switched_off_matches_torch():
    x = torch.randn(3, 5) * 2
    for enabled in (1, 0):
        def fn(v, enabled=enabled):
            return torch.ops.aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams(
                v, torch.tensor([0.2]), torch.tensor([1], dtype=torch.int32), torch.tensor([enabled], dtype=torch.long),
                -4, 3)

        for got, want in zip(compiled_strict(fn)(x), fn(x)):
            assert torch.equal(got, want), enabled


def test_integer_matmuls_match_torch():
    a = torch.randint(-128, 128, (32, 64), dtype=torch.int8)
    b = torch.randint(-128, 128, (64, 16), dtype=torch.int8)
    got = compiled_strict(torch._int_mm)(a, b)
    assert got.dtype == torch.int32 and torch.equal(got, torch._int_mm(a, b))
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(8, 64).to(dtype)
        w = torch.randint(-128, 128, (16, 64), dtype=torch.int8)
        scales = (torch.rand(16) * 0.01).to(dtype)
        got = compiled_strict(torch.ops.aten._weight_int8pack_mm)(x, w, scales)
        torch.testing.assert_close(got, torch.ops.aten._weight_int8pack_mm(x, w, scales))


def test_bad_quantization_arguments_are_named(tmp_path):
    class Bad(nn.Module):
        def forward(self, x):
            return qd.quantize_per_channel(x, torch.ones(3), torch.zeros(3, dtype=torch.long), 1, -128, 127,
                                           torch.int8)

    # Channels along dimension 1 are 4, not 3: torch's meta function lets it through; tpuc names it.
    archive = tmp_path / "bad.pt2"
    torch.export.save(torch.export.export(Bad(), (torch.randn(2, 4),)), archive)
    run = subprocess.run([tpuc_binary(), "compile", str(archive), "-o", os.devnull], capture_output=True, text=True)
    assert run.returncode == 1
    assert "scales should have one entry per channel (4 along dimension 1), got shape [3]" in run.stderr, run.stderr
    # The same through the backend (strict: refused, not run eagerly).
    with pytest.raises(Exception, match="scales should have one entry per channel"):
        compiled_strict(Bad())(torch.randn(2, 4))


F8 = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("f8", F8, ids=["e4m3fn", "e5m2"])
def test_eight_bit_floats_convert_as_torch_converts(f8):
    # Ties, values past the largest (NaN for e4m3fn, infinity for e5m2), tiny values.
    x = torch.tensor([0.0, 1.0625, -2.5, 0.1, 300.0, 500.0, -1e5, 1e-3, 3.0e-4, float("nan")])
    fn = lambda v: (v.to(f8), v.to(f8).to(torch.float32) * 2)  # noqa: E731
    got, want = compiled_strict(fn)(x), fn(x)
    assert got[0].dtype == f8
    # The same bits, but for NaN's payload (XLA's NaN for float8_e5m2 is 0x7E, torch's 0x7F).
    number = ~torch.isnan(want[0].float())
    assert torch.equal(got[0].view(torch.uint8)[number], want[0].view(torch.uint8)[number])
    assert torch.equal(torch.isnan(got[0].float()), ~number)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("f8", F8, ids=["e4m3fn", "e5m2"])
def test_scaled_mm_of_eight_bit_floats_matches_torch(f8):
    a = (torch.randn(16, 32) * 2).to(f8)
    b = (torch.randn(16, 32) * 2).to(f8).t()  # column-major, as _scaled_mm takes it
    cases = [
        dict(scale_a=torch.tensor(0.5), scale_b=torch.tensor(2.0), out_dtype=torch.bfloat16),
        dict(scale_a=torch.tensor(0.25), scale_b=torch.tensor(1.5), out_dtype=torch.float32,
             bias=torch.randn(16)),
        dict(scale_a=torch.rand(16, 1) + 0.5, scale_b=torch.rand(1, 16) + 0.5, out_dtype=torch.float32),
    ]
    for kwargs in cases:
        fn = lambda x, y, kw=kwargs: torch._scaled_mm(x, y, **kw)  # noqa: E731
        torch.testing.assert_close(compiled_strict(fn)(a, b), fn(a, b), rtol=1e-5, atol=1e-5, msg=str(kwargs))


def test_an_eight_bit_float_linear_layer_runs_through_tpuc_run(tmp_path):
    class F8Linear(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("weight", (torch.randn(8, 32) * 0.5).to(torch.float8_e4m3fn))

        def forward(self, x):
            q = (x * 4).to(torch.float8_e4m3fn)
            return torch._scaled_mm(q, self.weight.t(), scale_a=torch.tensor(0.25), scale_b=torch.tensor(1.0),
                                    out_dtype=torch.float32)

    x, model = torch.randn(4, 32), F8Linear()
    archive = tmp_path / "f8.pt2"
    torch.export.save(torch.export.export(model, (x,)), archive)
    np.save(tmp_path / "x.npy", x.numpy())
    run = subprocess.run([tpuc_binary(), "run", str(archive), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "out")],
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "out" / "out0.npy")), model(x),
                               rtol=1e-5, atol=1e-5)
