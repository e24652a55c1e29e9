"""16-bit floats rounded where torch's CPU kernels round them, compiled against eager torch bit
for bit: a scalar multiplies or divides in float32 (not rounded to 16 bits first), cross
products, logit and addr round after every step, addcmul computes in float32 and rounds once,
addbmm stores its result after each batch, a convolution adds its bias before rounding, batch
norm normalises with the statistics it stores in the parameters' type, and grid sampling runs
torch's scalar kernel step by step. Each test also checks that the other rounding (the one
torch's decompositions or a float32 computation would give) differs on the same data, so that
it can fail."""
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

HALF_TYPES = [torch.bfloat16, torch.float16]


def compiled(fn):
    return torch.compile(fn, backend="tpuc", options={"strict": True}, dynamic=False)


def assert_bitwise(got, want, atol=0.0):
    for g, w in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (g, w)
        torch.testing.assert_close(g, w, rtol=0, atol=atol, equal_nan=True)


def differs(a, b):
    return not torch.equal(a, b)


def data(*shape, dtype, low=-4.0, high=4.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g, dtype=torch.float64) * (high - low) + low).to(dtype)


@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_a_scalar_multiplies_and_divides_in_float32(dtype):
    x, y = data(4096, dtype=dtype), data(4096, dtype=dtype, seed=20)
    scalar = 1.0137
    factor = torch.tensor(scalar)  # a 0-dimensional float32 tensor counts as a scalar too

    def fn(x, y, factor):
        # A scalar added is rounded to 16 bits, as is alpha; alpha * y is not rounded.
        return (x * scalar, x / scalar, x * factor, x + scalar, x - scalar, torch.add(x, y, alpha=scalar),
                torch.sub(x, y, alpha=0.3), torch.rsub(x, y, alpha=scalar))

    want = fn(x, y, factor)
    assert_bitwise(compiled(fn)(x, y, factor), want)
    rounded = float(torch.tensor(scalar).to(dtype))
    assert differs((x.float() * rounded).to(dtype), want[0])
    assert differs(x + (y * rounded), want[5])


@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_cross_logit_and_addr_round_after_every_step(dtype):
    a, b = data(64, 3, dtype=dtype, seed=1), data(64, 3, dtype=dtype, seed=2)
    p = data(512, dtype=dtype, low=0.0, high=1.0, seed=3)
    m, v1, v2 = data(16, 24, dtype=dtype, seed=4), data(16, dtype=dtype, seed=5), data(24, dtype=dtype, seed=6)

    def fn(a, b, p, m, v1, v2):
        return (torch.linalg.cross(a, b), torch.cross(a.t(), b.t(), dim=0), torch.logit(p),
                torch.logit(p, eps=0.2), torch.addr(m, v1, v2), torch.addr(m, v1, v2, beta=0.5, alpha=1.5))

    want = fn(a, b, p, m, v1, v2)
    assert_bitwise(compiled(fn)(a, b, p, m, v1, v2), want)
    once = torch.linalg.cross(a.float(), b.float()).to(dtype)
    assert differs(once, want[0])
    assert differs(torch.logit(p.float()).to(dtype), want[2])
    assert differs(torch.addr(m.float(), v1.float(), v2.float()).to(dtype), want[4])


def test_addr_ignores_self_when_beta_is_zero_and_takes_booleans():
    m = torch.full((3, 4), float("nan"))
    v1, v2 = torch.arange(3.0), torch.arange(4.0)
    flags = torch.tensor([True, False, True]), torch.tensor([False, True, True, True])
    mask = torch.zeros(3, 4, dtype=torch.bool)

    def fn(m, v1, v2, a, b, mask):
        return torch.addr(m, v1, v2, beta=0), torch.addr(mask, a, b), torch.addr(mask, a, b, beta=False)

    assert_bitwise(compiled(fn)(m, v1, v2, *flags, mask), fn(m, v1, v2, *flags, mask))


@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_addcmul_computes_in_float32_and_rounds_once(dtype):
    x, t1, t2 = data(2048, dtype=dtype, seed=7), data(2048, dtype=dtype, seed=8), data(2048, dtype=dtype, seed=9)

    def fn(x, t1, t2):
        return torch.addcmul(x, t1, t2, value=0.37)

    want = fn(x, t1, t2)
    assert_bitwise(compiled(fn)(x, t1, t2), want)
    stepwise = x + (t1 * 0.37) * t2
    assert differs(stepwise, want)


@pytest.mark.parametrize("dtype", [torch.float32, *HALF_TYPES])
def test_addbmm_stores_the_result_after_each_batch(dtype):
    x, b1, b2 = data(6, 7, dtype=dtype, seed=10), data(5, 6, 9, dtype=dtype, seed=11), data(5, 9, 7, dtype=dtype, seed=12)

    def fn(x, b1, b2):
        return torch.addbmm(x, b1, b2), torch.addbmm(x, b1, b2, beta=0.5, alpha=2.0)

    got, want = compiled(fn)(x, b1, b2), fn(x, b1, b2)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want)  # the products' own sums follow the BLAS's order
        return
    assert_bitwise(got, want)
    once = (x.float() + torch.einsum("bij,bjk->ik", b1.float(), b2.float())).to(dtype)
    assert differs(once, want[0])


@pytest.mark.parametrize("dtype", HALF_TYPES)
@pytest.mark.parametrize("params", ["16-bit", "float32", "none"])
def test_batch_norm_normalises_with_the_statistics_it_stores(dtype, params):
    x = data(6, 5, 7, dtype=dtype, seed=13)
    param_type = torch.float32 if params == "float32" else dtype
    weight = None if params == "none" else data(5, dtype=param_type, low=0.5, high=2.0, seed=14)
    bias = None if params == "none" else data(5, dtype=param_type, seed=15)
    running = data(5, dtype=param_type, seed=16), data(5, dtype=param_type, low=0.5, high=2.0, seed=17)

    def fn(x, weight, bias, mean, var):
        trained = F.batch_norm(x, mean.clone(), var.clone(), weight, bias, training=True, momentum=0.3, eps=0.01)
        inferred = F.batch_norm(x, mean, var, weight, bias, training=False, eps=0.01)
        return trained, inferred

    want = fn(x, weight, bias, *running)
    # x * alpha + beta cancels to near zero at a few elements, where float32 residues below
    # 1e-6 may differ; 1e-6 is below a 16-bit ulp of any value above 3e-4.
    assert_bitwise(compiled(fn)(x, weight, bias, *running), want, atol=1e-6)
    if params == "16-bit":
        # Normalising with the float32 statistics (not the stored ones) rounds differently.
        wide = F.batch_norm(x.float(), None, None, weight.float(), bias.float(), training=True, eps=0.01)
        assert differs(wide.to(dtype), want[0])


@pytest.mark.parametrize("dtype", HALF_TYPES)
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_runs_the_scalar_kernel_step_by_step(dtype, mode, padding, align_corners):
    image = data(2, 3, 9, 13, dtype=dtype, seed=18)
    grid = data(2, 6, 5, 2, dtype=dtype, low=-1.2, high=1.2, seed=19)

    def fn(image, grid):
        return F.grid_sample(image, grid, mode=mode, padding_mode=padding, align_corners=align_corners)

    want = fn(image, grid)
    assert_bitwise(compiled(fn)(image, grid), want)
    if mode == "bilinear":
        assert differs(fn(image.float(), grid.float()).to(dtype), want)


@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_a_convolution_adds_its_bias_before_rounding(dtype):
    x, w, b = data(2, 3, 9, 9, dtype=dtype, seed=21), data(5, 3, 3, 3, dtype=dtype, seed=22), data(5, dtype=dtype, seed=23)

    def fn(x, w, b):
        return F.conv2d(x, w, b, padding=1), F.conv1d(x[:, :, 0], w[..., 0], b)

    want = fn(x, w, b)
    assert_bitwise(compiled(fn)(x, w, b), want)
    rounded_first = F.conv2d(x, w, None, padding=1) + b[:, None, None]
    assert differs(rounded_first, want[0])


# An XLA op computing a 16-bit float by arithmetic, in its optimized HLO text
# (`%name = f16[64,3]{1,0} multiply(...)`).
NARROW_ARITHMETIC = re.compile(
    r"= (f16|bf16)\[[^\]]*\]\S* (add|subtract|multiply|divide|power|remainder|atan2|exponential|"
    r"exponential-minus-one|log|log-plus-one|sqrt|rsqrt|cbrt|tanh|logistic|sine|cosine|tan|erf|dot|"
    r"convolution)\(")

NARROW_PROGRAMS = """
import torch
import torch.nn.functional as F

def fn(a, b, m, v1, v2, image, grid, w):
    return (torch.linalg.cross(a, b), torch.addr(m, v1, v2), a * b + a, torch.exp(a) * b, torch.logit(a.sigmoid()),
            F.grid_sample(image, grid, align_corners=False), m @ w, F.conv1d(image[:, :, 0], image[:, :, 1, :3]))

g = torch.Generator().manual_seed(0)
for dtype in (torch.float16, torch.bfloat16):
    args = [torch.randn(*shape, generator=g).to(dtype)
            for shape in [(64, 3), (64, 3), (16, 24), (16,), (24,), (2, 3, 9, 13), (2, 6, 5, 2), (24, 8)]]
    torch.compile(fn, backend="tpuc", options={"strict": True, "cache_dir": "off"})(*args)
print("compiled")
"""


def test_no_16_bit_arithmetic_reaches_xla(tmp_path):
    # XLA:CPU computes 16-bit arithmetic natively on CPUs with float16 instructions and through
    # float32 elsewhere, with other results (a multiply-add fused, other approximations): every
    # step must reach it as float32 between explicit roundings, whatever the host. Checked on the
    # module XLA optimized (its dump), so that no pass of XLA's narrows a step again.
    dump = tmp_path / "xla"
    env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={dump} --xla_dump_hlo_as_text", TF_CPP_MIN_LOG_LEVEL="3")
    run = subprocess.run([sys.executable, "-c", NARROW_PROGRAMS], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-3000:]
    optimized = list(dump.glob("*after_optimizations.txt"))
    assert optimized, sorted(p.name for p in dump.iterdir())
    text = "\n".join(p.read_text() for p in optimized)
    assert "f16[" in text and "bf16[" in text, "the programs take and return 16-bit tensors"
    narrow = [line.strip() for line in text.splitlines() if NARROW_ARITHMETIC.search(line)]
    assert not narrow, "\n".join(narrow[:20])
