"""Bessel and Airy functions compiled by tpuc, checked against exact values (mpmath, at 30
digits) rather than eager torch: eager's float64 J, Y and Ai are off by up to 1e-7 in places
(near x = 5 and x = -2.5), tpuc's stay within 1e-11 of the exact value. torch's own values at
0, for negative arguments and at infinity are checked too."""
import math

import mpmath
import pytest
import torch

mpmath.mp.dps = 30

FUNCTIONS = {
    "bessel_j0": (torch.special.bessel_j0, lambda x: mpmath.besselj(0, x)),
    "bessel_j1": (torch.special.bessel_j1, lambda x: mpmath.besselj(1, x)),
    "bessel_y0": (torch.special.bessel_y0, lambda x: mpmath.bessely(0, x)),
    "bessel_y1": (torch.special.bessel_y1, lambda x: mpmath.bessely(1, x)),
    "modified_bessel_k0": (torch.special.modified_bessel_k0, lambda x: mpmath.besselk(0, x)),
    "modified_bessel_k1": (torch.special.modified_bessel_k1, lambda x: mpmath.besselk(1, x)),
    "scaled_modified_bessel_k0": (torch.special.scaled_modified_bessel_k0,
                                  lambda x: mpmath.besselk(0, x) * mpmath.exp(x)),
    "scaled_modified_bessel_k1": (torch.special.scaled_modified_bessel_k1,
                                  lambda x: mpmath.besselk(1, x) * mpmath.exp(x)),
    "airy_ai": (torch.special.airy_ai, mpmath.airyai),
}
# Functions of the second kind are defined for x > 0 only.
POSITIVE_ONLY = {"bessel_y0", "bessel_y1", "modified_bessel_k0", "modified_bessel_k1",
                 "scaled_modified_bessel_k0", "scaled_modified_bessel_k1"}


def compiled(fn):
    # Dynamo compiles every torch function through the same wrapper frame: past its recompile
    # limit it would run the function eagerly, unseen. Each function starts afresh.
    torch._dynamo.reset()
    return torch.compile(fn, backend="tpuc", options={"strict": True}, dynamic=False)


def exact(reference, values):
    return torch.tensor([float(reference(mpmath.mpf(v))) for v in values.tolist()], dtype=torch.float64)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_bessel_and_airy_functions_match_exact_values(name):
    fn, reference = FUNCTIONS[name]
    # Both sides of every switch between methods (2, 12, 30; Airy's -7 and 2.08), tiny and
    # large arguments.
    x = torch.cat([torch.linspace(0.01, 40.0, 397, dtype=torch.float64),
                   torch.tensor([1e-6, 1.999, 2.001, 11.99, 12.01, 29.99, 30.01, 7.01, 6.99, 2.07, 2.09, 100.0, 1e4], dtype=torch.float64)])
    if name not in POSITIVE_ONLY:
        x = torch.cat([x, -x[x < 30]])
    got, want = compiled(fn)(x), exact(reference, x)
    small = want.abs() < 1e-300
    torch.testing.assert_close(got[~small], want[~small], rtol=1e-10, atol=1e-11)
    # float32 is computed in float64 and rounded once.
    x32 = x.float()
    torch.testing.assert_close(compiled(fn)(x32), exact(reference, x32.double()).float(), rtol=2e-6, atol=1e-6)


def test_bessel_and_airy_functions_at_their_edges():
    edges = torch.tensor([0.0, -0.0, -1.0, math.inf, -math.inf, math.nan], dtype=torch.float64)
    for name, (fn, _) in FUNCTIONS.items():
        got = compiled(fn)(edges)
        want = fn(edges)
        # Where eager gives NaN at an infinity the function's limit is 0 there (tpuc's value);
        # the second kinds stay NaN for every negative argument.
        limit = want.isnan() & ((edges == math.inf) | ((edges == -math.inf) & (name not in POSITIVE_ONLY)))
        assert torch.equal(got[limit], torch.zeros_like(got[limit])), (name, got)
        torch.testing.assert_close(got[~limit], want[~limit], equal_nan=True, msg=name)


CHEBYSHEV = [f"{shift}chebyshev_polynomial_{kind}" for shift in ("", "shifted_") for kind in "tuvw"]


@pytest.mark.parametrize("name", CHEBYSHEV)
def test_chebyshev_polynomials_of_tensor_degrees_match_torch(name):
    fn = getattr(torch.special, name)
    # Inside and outside [-1, 1] (shifted: [0, 1]), at its ends and 0, NaN; negative degrees.
    xs = torch.cat([torch.linspace(-3, 3, 61), torch.tensor([-1.0, 1.0, 0.0, 0.5, math.nan, -0.999, 0.999])]).double()
    x, n = torch.meshgrid(xs, torch.arange(-2, 25).double(), indexing="ij")
    want = fn(x, n)  # torch's float64 recurrence
    torch.testing.assert_close(compiled(fn)(x, n), want, rtol=1e-9, atol=1e-9, equal_nan=True)
    # float32 is computed in float64 and rounded once (eager's float32 recurrence drifts further).
    torch.testing.assert_close(compiled(fn)(x.float(), n.float()), want.float(), equal_nan=True)
    # Integer arguments give float32; a Python number for either argument; fractional degrees
    # truncate.
    xi, ni = x.nan_to_num().long(), n.long()
    torch.testing.assert_close(compiled(fn)(xi, ni), fn(xi, ni), equal_nan=True)
    torch.testing.assert_close(compiled(lambda v: fn(v, 3))(x), fn(x, 3), equal_nan=True)
    torch.testing.assert_close(compiled(lambda v: fn(0.25, v))(n), fn(0.25, n), equal_nan=True)
    torch.testing.assert_close(compiled(fn)(x, n + 0.7), fn(x, n + 0.7), rtol=1e-9, atol=1e-9, equal_nan=True)


RECURRENCES = ["hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p"]


@pytest.mark.parametrize("name", RECURRENCES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_polynomials_of_recurrences_match_torch_to_its_degrees_and_edges(name, dtype):
    """One loop to the largest degree, each element keeping its value at its own degree, in
    torch's arithmetic: its values at 0, +-1, NaN and infinities, for negative, fractional and
    non-finite degrees and Hermite's beyond its limit (NaN past 128 in float32, 512 in float64)."""
    fn = getattr(torch.special, name)
    xs = torch.tensor([-2.0, -1.0, -0.5, 0.0, 0.3, 1.0, 1.7, math.nan, math.inf, -math.inf], dtype=dtype)
    ns = torch.tensor([-1.0, 0, 1, 2, 3, 7, 12, 130, 600, 5.7, math.nan, math.inf], dtype=dtype)
    x, n = torch.meshgrid(xs, ns, indexing="ij")
    torch.testing.assert_close(compiled(fn)(x, n), fn(x, n), rtol=1e-5, atol=1e-6, equal_nan=True)
    # Integer degrees and a Python number for either argument.
    torch.testing.assert_close(compiled(lambda v: fn(v, 4))(x), fn(x, 4), equal_nan=True)
    torch.testing.assert_close(compiled(lambda v: fn(0.25, v))(ns.nan_to_num().long()), fn(0.25, ns.nan_to_num().long()),
                               equal_nan=True)


INCOMPLETE_GAMMA_A = [0.0, 0.3, 1.0, 2.5, 7.0, 10.0, 50.0, 200.0, math.inf, -1.0, 5.0, 1e5]
INCOMPLETE_GAMMA_X = [0.0, 0.1, 1.0, 3.0, 9.0, 11.0, 48.0, 230.0, math.inf, 1.0, -2.0, 1e5]


def incomplete_gamma_case(upper, dtype):
    fn = torch.special.gammaincc if upper else torch.special.gammainc
    a, x = torch.meshgrid(torch.tensor(INCOMPLETE_GAMMA_A, dtype=dtype),
                          torch.tensor(INCOMPLETE_GAMMA_X, dtype=dtype), indexing="ij")
    # Where 300 terms do not converge (a far beyond a thousand, x near a) the result is NaN, not
    # a wrong number.
    unconverged = (a == 1e5) & (x == 1e5)
    got = compiled(fn)(a, x)
    assert got[unconverged].isnan().all()
    return got[~unconverged], fn(a, x)[~unconverged]


@pytest.mark.parametrize("upper", [False, True])
def test_regularized_incomplete_gamma_functions_match_torch(upper):
    # Both methods (series below x = a + 1, continued fraction above) and torch's edges.
    got, want = incomplete_gamma_case(upper, torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-12, equal_nan=True)


@pytest.mark.parametrize("upper", [False, True])
def test_regularized_incomplete_gamma_functions_in_float32_match_torch(upper):
    # float32 (16-bit floats take the same path: computed in float64, rounded once). The series
    # and the continued fraction are loops (one body compiled): unrolled, XLA:CPU took minutes.
    got, want = incomplete_gamma_case(upper, torch.float32)
    torch.testing.assert_close(got, want, equal_nan=True)
