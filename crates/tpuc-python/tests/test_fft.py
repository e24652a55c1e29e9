"""Complex numbers and FFTs: torch.fft functions and complex arithmetic through
torch.compile(backend="tpuc") in strict mode against eager (complex inputs and outputs, a
gradient through FFTs); the undecomposed torch.fft ops of a raw torch.export graph through
`tpuc compile` + `tpuc run`; and complex ops tpuc does not compute refused by name."""
import os
import subprocess

import numpy as np
import pytest
import torch
import torch.nn as nn
from test_zoo import tpuc_binary

g = torch.Generator().manual_seed(0)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g, dtype=dtype)


x = randn(4, 6)
x3 = randn(2, 4, 6)
z = randn(3, 5, dtype=torch.complex64)
z128 = randn(3, 4, dtype=torch.complex128)

CASES = {
    "rfft_irfft": (lambda x: (torch.fft.rfft(x), torch.fft.irfft(torch.fft.rfft(x), n=6)), (x,)),
    "rfft_norms": (lambda x: [torch.fft.rfft(x, norm=n) for n in ("backward", "ortho", "forward")], (x,)),
    "irfft_sizes": (lambda x: (torch.fft.irfft(torch.fft.rfft(x), n=9), torch.fft.irfft(torch.fft.rfft(x), n=4, norm="ortho")), (x,)),
    "fft_of_real": (lambda x: (torch.fft.fft(x, dim=0), torch.fft.ifft(x, n=8, norm="forward")), (x,)),
    "fft2_fftn": (lambda x: (torch.fft.fft2(x), torch.fft.fftn(x, s=(3, 5, 7)), torch.fft.ifftn(x, dim=(0, 2))), (x3,)),
    "rfftn_irfftn": (lambda x: (torch.fft.rfftn(x), torch.fft.irfftn(torch.fft.rfftn(x), s=(4, 6), dim=(1, 2))), (x3,)),
    "hfft_ihfft": (lambda x: (torch.fft.hfft(x), torch.fft.ihfft(x), torch.fft.hfftn(x, s=(3, 8)), torch.fft.ihfft2(x)), (x,)),
    "four_dims": (lambda x: torch.fft.fftn(x.reshape(1, 2, 2, 3, 2)), (randn(2, 12),)),
    "shifts": (lambda x: (torch.fft.fftshift(x), torch.fft.ifftshift(x, dim=1)), (randn(5, 6),)),
    "complex_fft": (lambda z: (torch.fft.fft(z), torch.fft.ifft2(z), torch.fft.irfft(z)), (z,)),
    "complex128_fft": (lambda z: torch.fft.fftn(z), (z128,)),
    "complex_arithmetic": (lambda z: (z * z.conj() + 1, z / (z + 2), z - 0.5 * z, (z * 3).sum(0), z.mean()), (z,)),
    "complex_parts": (lambda z: (z.real, z.imag, z.abs(), z.angle(), torch.view_as_real(z)), (z,)),
    "complex_from_parts": (lambda a, b: (torch.complex(a, b), torch.view_as_complex(torch.stack([a, b], -1))), (x, randn(4, 6))),
    "spectral_filter": (lambda x, w: torch.fft.irfft(torch.fft.rfft(x) * w, n=6), (x, torch.linspace(1, 0, 4))),
    "int_input": (lambda i: torch.fft.rfft(i), (torch.arange(8),)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fft_matches_eager(name):
    fn, args = CASES[name]
    compiled = torch.compile(fn, backend="tpuc", options={"strict": True})
    torch.testing.assert_close(compiled(*args), fn(*args), atol=1e-4, rtol=1e-4)


def test_gradient_through_ffts_matches_eager():
    def loss(x):
        spectrum = torch.fft.rfft(x)
        return (spectrum.abs() ** 2).sum() + torch.fft.irfft(spectrum * 0.5, n=6).sum() + \
            torch.view_as_real(torch.fft.fftn(x)).sum()

    compiled = torch.compile(loss, backend="tpuc", options={"strict": True})
    a = x.clone().requires_grad_()
    b = x.clone().requires_grad_()
    loss(a).backward()
    compiled(b).backward()
    torch.testing.assert_close(b.grad, a.grad, atol=1e-4, rtol=1e-4)


class Spectra(nn.Module):
    """The torch.fft functions a raw export keeps whole (aten.fft_*)."""

    def forward(self, x, z):
        return (
            torch.fft.fft(x, n=8, norm="ortho"),
            torch.fft.ifft(z, dim=0),
            torch.fft.rfft2(x, s=(3, 4)),
            torch.fft.irfft2(z, norm="forward"),
            torch.fft.hfft(z, n=7),
            torch.fft.ihfftn(x),
            torch.fft.fftshift(torch.fft.fftn(z, dim=(1,))),
            torch.fft.ifftshift(x, dim=0),
        )


def test_export_ffts_run_on_the_plugin(tmp_path):
    args = (randn(4, 6), randn(3, 5, dtype=torch.complex64))
    program = torch.export.export(Spectra(), args)
    targets = {str(n.target) for n in program.graph.nodes}
    assert {"aten.fft_fft.default", "aten.fft_hfft.default", "aten.fft_ihfftn.default"} <= targets, targets
    archive = tmp_path / "spectra.pt2"
    torch.export.save(program, str(archive))
    np.savez(tmp_path / "inputs.npz", *[a.numpy() for a in args])
    expected = [t.resolve_conj().numpy() for t in Spectra()(*args)]
    np.savez(tmp_path / "expected.npz", *expected)
    run = subprocess.run(
        [tpuc_binary(), "run", str(archive), "--input", str(tmp_path / "inputs.npz"),
         "--out", str(tmp_path / "out"), "--expect", str(tmp_path / "expected.npz"), "--rtol", "1e-4", "--atol", "1e-4"],
        capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    # Complex outputs are written as complex .npy files.
    written = [np.load(tmp_path / "out" / f"out{i}.npy") for i in range(len(expected))]
    assert [w.dtype for w in written] == [e.dtype for e in expected]


def test_complex_op_without_complex_lowering_is_refused():
    f = torch.compile(lambda x: torch.fft.fft(x).exp(), backend="tpuc", options={"strict": True})
    with pytest.raises(Exception, match=r"not supported: aten\.exp\.default on complex tensors"):
        f(x)


def test_complex_tensors_are_gathered_and_indexed():
    """Rotary embeddings as complex numbers (TorchTitan's): a cache of unit complex numbers picked
    by position, with `gather` and with advanced indexing, multiplied into the queries."""
    def rotate(x, cache, positions):
        pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        batch, length = positions.shape
        picked = torch.gather(cache[None, :, None, :].expand(batch, -1, -1, -1), 1,
                              positions.view(batch, length, 1, 1).expand(batch, length, 1, cache.shape[-1]))
        indexed = cache[positions[0]][None, :, None, :]
        return torch.view_as_real(pairs * picked * indexed).flatten(3)

    angles = torch.outer(torch.arange(16.0), torch.linspace(0.1, 1.0, 4))
    cache = torch.polar(torch.ones_like(angles), angles)
    x, positions = randn(2, 8, 3, 8), torch.randint(0, 16, (2, 8), generator=g)
    compiled = torch.compile(rotate, backend="tpuc", options={"strict": True})
    torch.testing.assert_close(compiled(x, cache, positions), rotate(x, cache, positions), atol=1e-5, rtol=1e-5)
