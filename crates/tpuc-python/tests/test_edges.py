"""Integer, boolean and float semantics at the edges, compiled against eager torch bit for bit:
shifts by tensors and by out-of-range amounts, the sign bit of -0.0 and of negative NaNs,
rounding to decimals (and division by constants, exact), gcd and lcm with zeros and negatives,
frexp of extreme and non-finite values, scans with NaNs and ties, hypot and nextafter at
infinities, and bit views (`view(dtype)`) between widths. The CPU plugin flushes subnormals to
zero (tested as such)."""
import pytest
import torch


def compiled(fn):
    return torch.compile(fn, backend="tpuc", options={"strict": True}, dynamic=False)


def assert_same(got, want):
    for g, w in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (g, w)
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8])
def test_shifts_by_any_amount_match_torch(dtype):
    bits = torch.iinfo(dtype).bits
    amounts = torch.tensor([-1, 0, 1, 3, bits - 1, bits, bits + 5, 100][: 8], dtype=torch.int64).clamp(
        torch.iinfo(dtype).min, torch.iinfo(dtype).max).to(dtype)
    values = torch.tensor([1, -1, 5, -7, 100, -128, 127, 3], dtype=torch.int64).clamp(
        torch.iinfo(dtype).min, torch.iinfo(dtype).max).to(dtype)

    def fn(v, s):
        return (v << s, v >> s, torch.bitwise_left_shift(v, 2), torch.bitwise_right_shift(v, 1),
                torch.bitwise_left_shift(3, s) if dtype != torch.uint8 else v)

    assert_same(compiled(fn)(values, amounts), fn(values, amounts))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_signbit_sees_negative_zero_and_negative_nan(dtype):
    x = torch.tensor([-0.0, 0.0, float("nan"), float("-inf"), float("inf"), 1.0, -1.0], dtype=dtype)
    x = torch.cat([x, -x[2:3]])  # a NaN with its sign bit set
    assert_same(compiled(torch.signbit)(x), torch.signbit(x))
    assert_same(compiled(torch.copysign)(torch.ones_like(x), x), torch.copysign(torch.ones_like(x), x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rounding_to_decimals_matches_torch(dtype):
    x = torch.tensor([0.125, 0.135, 2.5, -2.5, 1234.5678, -0.0049, 15.0, 25.0, 1e30], dtype=dtype)
    for decimals in (0, 1, 2, 3, -1, -2):
        assert_same(compiled(lambda v, d=decimals: torch.round(v, decimals=d))(x), torch.round(x, decimals=decimals))
    # XLA would multiply by the reciprocal of a constant divisor (rounding differently): tpuc
    # keeps the division.
    y = torch.randn(10000, dtype=dtype) * 1000
    assert_same(compiled(lambda v: v / 100.0)(y), y / 100.0)


@pytest.mark.parametrize("dtype", [torch.int16, torch.int32, torch.int64])
def test_gcd_and_lcm_with_zeros_negatives_and_slow_pairs(dtype):
    # 28657 and 17711 are consecutive Fibonacci numbers: Euclid's slowest pair in 16 bits.
    a = torch.tensor([0, 0, 12, -12, 7, 28657, 17711, -30000, 1], dtype=dtype)
    b = torch.tensor([0, 5, 18, 18, -21, 17711, 10946, 20000, -1], dtype=dtype)
    fn = lambda x, y: (torch.gcd(x, y), torch.lcm(x, y))  # noqa: E731
    assert_same(compiled(fn)(a, b), fn(a, b))
    if dtype == torch.int64:
        big = torch.tensor([7540113804746346429, 2 ** 62], dtype=dtype)
        other = torch.tensor([4660046610375530309, 2 ** 40 * 3], dtype=dtype)
        assert_same(compiled(torch.gcd)(big, other), torch.gcd(big, other))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_frexp_of_extreme_and_non_finite_values(dtype):
    info = torch.finfo(dtype)
    x = torch.tensor([0.0, -0.0, 1.0, 0.75, -3.0, 1024.0, float("inf"), float("-inf"), float("nan"),
                      info.tiny, -info.tiny * 3, info.max, info.min, info.eps], dtype=dtype)
    assert_same(compiled(torch.frexp)(x), torch.frexp(x))


def test_the_cpu_plugin_flushes_subnormals_to_zero():
    # XLA's CPU runtime computes with subnormal floats flushed to zero (docs/conformance.md):
    # where torch's result is or reads a subnormal, tpuc's is zero. Should the plugin change,
    # this test says so, and frexp, hypot and nextafter can be tested on subnormals too.
    # Bit-level results are exact: nextafter from zero is the smallest subnormal.
    x = torch.tensor([1e-40])
    assert torch.equal(compiled(lambda v: v * 2.0)(x), torch.zeros(1))
    zero = torch.zeros(1)
    assert_same(compiled(lambda v: torch.nextafter(v, v + 1))(zero), torch.nextafter(zero, zero + 1))


def test_scans_with_nans_ties_and_infinities():
    x = torch.tensor([[1.0, 3.0, 3.0, float("nan"), 5.0, float("nan"), 2.0, 5.0],
                      [-1.0, -1.0, -2.0, -2.0, 0.0, -0.0, 4.0, 4.0]])
    for fn in (lambda v: torch.cummax(v, 1), lambda v: torch.cummin(v, 1), lambda v: torch.cummax(v, 0)):
        assert_same(compiled(fn)(x), fn(x))
    ints = torch.tensor([3, 1, 3, 2, 5, 5, 0], dtype=torch.int32)
    assert_same(compiled(lambda v: torch.cummin(v, 0))(ints), torch.cummin(ints, 0))
    y = torch.tensor([float("-inf"), -1000.0, 0.0, 1000.0, 1000.0, float("inf"), 3.0])
    got = compiled(lambda v: torch.logcumsumexp(v, 0))(y)
    torch.testing.assert_close(got, torch.logcumsumexp(y, 0))
    # A sum whose early prefixes are far below its total: no prefix underflows to -inf.
    z = torch.tensor([-1000.0, -999.0, 0.0])
    torch.testing.assert_close(compiled(lambda v: torch.logcumsumexp(v, 0))(z), torch.logcumsumexp(z, 0))


def test_hypot_and_nextafter_at_the_edges():
    a = torch.tensor([3.0, float("inf"), float("nan"), 0.0, 1e38, -1e-30, 0.0])
    b = torch.tensor([4.0, float("nan"), float("-inf"), 0.0, 1e38, 1e-30, -0.0])
    assert_same(compiled(torch.hypot)(a, b), torch.hypot(a, b))
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        x = torch.tensor([0.0, 0.0, 1.0, 1.0, -1.0, float("inf"), 2.0, 1e30], dtype=dtype)
        y = torch.tensor([1.0, -1.0, 2.0, 0.0, float("-inf"), 0.0, 2.0, float("inf")], dtype=dtype)
        assert_same(compiled(torch.nextafter)(x, y), torch.nextafter(x, y))


@pytest.mark.parametrize("source,target", [
    (torch.float32, torch.int32), (torch.float32, torch.uint8), (torch.uint8, torch.float32),
    (torch.bfloat16, torch.int16), (torch.float16, torch.bfloat16), (torch.float64, torch.int32),
    (torch.int32, torch.float64), (torch.bool, torch.uint8), (torch.int8, torch.bool),
])
def test_bit_views_between_types_match_torch(source, target):
    torch.manual_seed(0)
    if source == torch.bool:
        x = torch.rand(3, 8) > 0.5
    elif source.is_floating_point:
        x = (torch.randn(3, 8) * 100).to(source)
    else:
        x = torch.randint(0, 2 if target == torch.bool else 100, (3, 8)).to(source)
    fn = lambda v: v.view(target) + 0 if target != torch.bool else v.view(target) & True  # noqa: E731
    assert_same(compiled(fn)(x), fn(x))
