"""Linear algebra against eager torch (LAPACK): solves, determinants, inverses, Cholesky,
triangular solves, LU, QR, symmetric eigendecompositions, SVDs, polar decompositions and
symmetric square roots over batches of matrices, compiled with torch.compile and exported
through `tpuc run`; what tpuc refuses is named."""
import subprocess

import numpy as np
import pytest
import torch
from test_zoo import tpuc_binary

# LAPACK and tpuc's unrolled or XLA-expanded factorisations round differently.
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-12)}


def compiled(fn):
    return torch.compile(fn, backend="tpuc", options={"strict": True}, dynamic=False)


def well_conditioned(*shape, dtype=torch.float32):
    n = shape[-1]
    return (torch.randn(*shape, dtype=torch.float64) + 3 * torch.eye(n, dtype=torch.float64)).to(dtype)


def positive_definite(*shape, dtype=torch.float32):
    a = torch.randn(*shape, dtype=torch.float64)
    return (a @ a.mT + shape[-1] * torch.eye(shape[-1], dtype=torch.float64)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batched_solve_determinant_and_inverse_match_torch(dtype):
    a = well_conditioned(3, 2, 5, 5, dtype=dtype)
    # Rows out of order, so that pivoting must swap them.
    a[0, 0] = a[0, 0][[3, 0, 4, 1, 2]]
    b = torch.randn(3, 2, 5, 4, dtype=dtype)
    vec = torch.randn(3, 2, 5, dtype=dtype)

    def fn(m, rhs, v):
        sign, logabs = torch.linalg.slogdet(m)
        return (torch.linalg.solve(m, rhs), torch.linalg.solve(m, v), torch.linalg.det(m), sign, logabs,
                torch.linalg.inv(m), torch.linalg.solve(m, rhs.mT, left=False))

    for got, want in zip(compiled(fn)(a, b, vec), fn(a, b, vec)):
        torch.testing.assert_close(got, want, **TOL[dtype])


def test_singular_and_permuted_determinants():
    # A zero column makes the pivot of its step exactly zero in any elimination order.
    singular = torch.tensor([[1.0, 0.0, 2.0], [3.0, 0.0, 4.0], [5.0, 0.0, 6.0]])
    swapped = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    negative = torch.diag(torch.tensor([-2.0, 3.0, 0.5]))
    for m in (singular, swapped, negative):
        torch.testing.assert_close(compiled(torch.linalg.det)(m), torch.linalg.det(m))
        got, want = compiled(torch.linalg.slogdet)(m), torch.linalg.slogdet(m)
        assert torch.equal(got[0].abs(), want[0].abs()) and torch.equal(got[0] * want[0] >= 0, torch.tensor(True))
        torch.testing.assert_close(got[1], want[1])
    # LU reports the step of the zero pivot, as LAPACK does; torch.linalg.solve raises torch's
    # own error for it, after the compiled call.
    got, want = compiled(torch.linalg.lu_factor_ex)(singular), torch.linalg.lu_factor_ex(singular)
    assert got.info.item() == want.info.item() == 2
    with pytest.raises(torch._C._LinAlgError, match="singular"):
        compiled(torch.linalg.solve)(singular, torch.ones(3, 1))
    with pytest.raises(torch._C._LinAlgError, match="not positive-definite"):
        compiled(torch.linalg.cholesky)(-torch.eye(3))


def test_cholesky_and_the_solves_built_on_it_match_torch():
    a = positive_definite(4, 6, 6, dtype=torch.float64)
    b = torch.randn(4, 6, 3, dtype=torch.float64)

    def fn(m, rhs):
        lower = torch.linalg.cholesky(m)
        upper = torch.linalg.cholesky(m, upper=True)
        return (lower, upper, torch.cholesky_solve(rhs, lower), torch.cholesky_solve(rhs, upper, upper=True),
                torch.cholesky_inverse(lower), torch.linalg.cholesky_ex(m).info)

    for got, want in zip(compiled(fn)(a, b), fn(a, b)):
        torch.testing.assert_close(got, want, **TOL[torch.float64])
    # Not positive definite: info names the failing minor, as LAPACK's does.
    bad = torch.eye(4, dtype=torch.float64)
    bad[2, 2] = -1.0
    assert compiled(lambda m: torch.linalg.cholesky_ex(m).info)(bad).item() == 3 == \
        torch.linalg.cholesky_ex(bad).info.item()


def test_triangular_solves_on_every_side_match_torch():
    t = torch.randn(2, 5, 5).tril() + 4 * torch.eye(5)
    b = torch.randn(2, 5, 3)
    c = torch.randn(2, 3, 5)

    def fn(lower, rhs, right):
        upper = lower.mT
        return (torch.linalg.solve_triangular(lower, rhs, upper=False),
                torch.linalg.solve_triangular(upper, rhs, upper=True, unitriangular=True),
                torch.linalg.solve_triangular(lower, right, upper=False, left=False),
                torch.triangular_solve(rhs, upper, upper=True, transpose=True).solution)

    for got, want in zip(compiled(fn)(t, b, c), fn(t, b, c)):
        torch.testing.assert_close(got, want, **TOL[torch.float32])


def test_lu_factor_solve_and_unpack_match_torch():
    a = well_conditioned(3, 4, 4, dtype=torch.float64)
    rect = torch.randn(2, 5, 3, dtype=torch.float64)
    b = torch.randn(3, 4, 2, dtype=torch.float64)

    def fn(m, r, rhs):
        lu, piv = torch.linalg.lu_factor(m)
        p, lower, upper = torch.linalg.lu(r)
        return (lu, piv, torch.linalg.lu_solve(lu, piv, rhs), torch.linalg.lu_solve(lu, piv, rhs, adjoint=True),
                p, lower, upper, *torch.lu_unpack(lu, piv))

    for got, want in zip(compiled(fn)(a, rect, b), fn(a, rect, b)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, **TOL[torch.float64])


@pytest.mark.parametrize("shape", [(4, 4), (6, 3), (3, 5), (2, 5, 4)])
def test_qr_matches_torch(shape):
    a = torch.randn(*shape, dtype=torch.float64)
    for mode in ("reduced", "complete", "r"):
        got, want = compiled(lambda m, mode=mode: torch.linalg.qr(m, mode=mode))(a), torch.linalg.qr(a, mode=mode)
        for g, w in zip(got, want):
            assert g.shape == w.shape, (mode, g.shape, w.shape)
            # Householder reflections as LAPACK chooses them: the same signs.
            torch.testing.assert_close(g, w, **TOL[torch.float64])
    geqrf = compiled(torch.geqrf)(a)
    for g, w in zip(geqrf, torch.geqrf(a)):
        torch.testing.assert_close(g, w, **TOL[torch.float64])


def same_up_to_column_signs(got, want, tol):
    signs = torch.sign((got * want).sum(-2, keepdim=True))
    torch.testing.assert_close(got * signs, want, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_eigh_and_svd_match_torch_up_to_the_sign_of_each_vector(dtype):
    s = positive_definite(3, 6, 6, dtype=dtype) - 6 * torch.eye(6, dtype=dtype)
    w, v = compiled(torch.linalg.eigh)(s)
    want_w, want_v = torch.linalg.eigh(s)
    torch.testing.assert_close(w, want_w, **TOL[dtype])
    same_up_to_column_signs(v, want_v, TOL[dtype])
    torch.testing.assert_close(compiled(lambda m: torch.linalg.eigvalsh(m, UPLO="U"))(s), want_w, **TOL[dtype])
    for shape in [(5, 5), (2, 6, 4), (3, 7)]:
        a = torch.randn(*shape, dtype=dtype)
        u, sv, vh = compiled(lambda m: torch.linalg.svd(m, full_matrices=False))(a)
        want_u, want_s, want_vh = torch.linalg.svd(a, full_matrices=False)
        torch.testing.assert_close(sv, want_s, **TOL[dtype])
        same_up_to_column_signs(u, want_u, TOL[dtype])
        same_up_to_column_signs(vh.mT, want_vh.mT, TOL[dtype])
        torch.testing.assert_close(compiled(torch.linalg.svdvals)(a), want_s, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_polar_decomposition_and_symmetric_square_root_match_torch(dtype):
    for shape in [(5, 5), (2, 6, 4)]:
        a = torch.randn(*shape, dtype=dtype)
        u, h = compiled(torch.linalg.polar)(a)
        want_u, want_h = torch.linalg.polar(a)
        torch.testing.assert_close(u, want_u, **TOL[dtype])
        torch.testing.assert_close(h, want_h, **TOL[dtype])
    with pytest.raises(Exception, match="at least as many rows as columns, but got 3 by 5"):
        compiled(torch.linalg.polar)(torch.randn(3, 5, dtype=dtype))
    spd = positive_definite(2, 5, 5, dtype=dtype)
    # Only the lower triangle is read; negative eigenvalues (an indefinite matrix) count as 0.
    upper_noise = torch.randn(2, 5, 5, dtype=dtype).triu(1)
    indefinite = spd - 8 * torch.eye(5, dtype=dtype)
    for m in (spd, spd.tril() + upper_noise, indefinite):
        torch.testing.assert_close(compiled(torch.linalg.matrix_sqrth)(m), torch.linalg.matrix_sqrth(m), **TOL[dtype])


def test_what_tpuc_does_not_compute_is_refused_by_name():
    with pytest.raises(Exception, match="full_matrices=True of a non-square matrix"):
        compiled(lambda m: torch.linalg.svd(m))(torch.randn(4, 3))
    with pytest.raises(Exception, match="on complex tensors"):
        compiled(torch.linalg.det)(torch.randn(3, 3, dtype=torch.complex64))
    with pytest.raises(Exception, match="linear algebra takes float32 and float64"):
        compiled(torch.linalg.det)(torch.randn(3, 3, dtype=torch.bfloat16))


def test_an_exported_solver_runs_through_tpuc_run(tmp_path):
    class Solver(torch.nn.Module):
        def forward(self, a, b):
            return torch.linalg.solve(a, b), torch.linalg.det(a), torch.linalg.cholesky(a @ a.mT + torch.eye(3))

    a, b = well_conditioned(4, 3, 3), torch.randn(4, 3, 2)
    archive = tmp_path / "solver.pt2"
    torch.export.save(torch.export.export(Solver(), (a, b)), archive)
    np.savez(tmp_path / "in.npz", a.numpy(), b.numpy())
    run = subprocess.run([tpuc_binary(), "run", str(archive), "-i", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out")],
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    for i, want in enumerate(Solver()(a, b)):
        torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "out" / f"out{i}.npy")), want, **TOL[torch.float32])
