"""Faults a long-lived user meets, each a clear error or a recompile, never a crash, a hang or a
wrong result: a plugin that does not load, a cache directory that becomes unwritable or full
mid-run, executables damaged on disk, a process killed while filling the cache, an archive
changed between compiling and loading. (An archive changed between `tpuc compile` and
`tpuc run` is test_wheel's; a plugin failing at client creation is tpuc-pjrt's runtime tests',
with options the plugin refuses.)"""
import os
import signal
import subprocess
import sys

import pytest
import torch

import tpuc

RUN = """
import resource, signal, sys, torch, tpuc
{setup}
f = torch.compile(lambda x: (x.sin() * 2).cumsum(0), backend="tpuc")
for n in {sizes}:
    x = torch.arange(float(n))
    assert torch.allclose(f(x), (x.sin() * 2).cumsum(0), atol=1e-5), n
print("ok")
"""


def _run(cache, sizes=(3,), setup="", check=True):
    run = subprocess.run([sys.executable, "-c", RUN.format(setup=setup, sizes=list(sizes))], capture_output=True,
                         text=True, timeout=300,
                         env=dict(os.environ, TPUC_CACHE_DIR=str(cache), TF_CPP_MIN_LOG_LEVEL="3"))
    if check:
        assert run.returncode == 0 and run.stdout.split() == ["ok"], run.stderr[-3000:]
    return run


def test_a_file_that_is_no_plugin_is_a_clear_error(tmp_path):
    fake = tmp_path / "libfake_pjrt.so"
    fake.write_text("not a shared library")
    f = torch.compile(lambda x: x + 1, backend="tpuc", options={"plugin": str(fake)})
    with pytest.raises(Exception, match=r"cannot load PJRT plugin .*libfake_pjrt\.so"):
        f(torch.ones(2))
    with pytest.raises(tpuc.TpucError, match=r"cannot load PJRT plugin .*libfake_pjrt\.so"):
        tpuc.compile_exported(torch.export.export(torch.nn.Linear(2, 2), (torch.ones(1, 2),)), plugin=str(fake))
    with pytest.raises(Exception, match="no such file"):
        torch.compile(lambda x: x + 1, backend="tpuc", options={"plugin": str(tmp_path / "gone.so")})(torch.ones(2))


def test_a_cache_that_becomes_unwritable_mid_run_still_compiles(tmp_path):
    cache = tmp_path / "cache"
    # After the first graph the directory is gone and a file stands in its place (unwritable even
    # for root); later graphs compile, with one warning.
    setup = (f"import shutil\nf0 = torch.compile(lambda x: x * 3, backend='tpuc'); f0(torch.ones(2))\n"
             f"shutil.rmtree({str(cache)!r}); open({str(cache)!r}, 'w').close()")
    run = _run(cache, sizes=(3, 5, 7), setup=setup)
    assert run.stderr.count("compiled executables are not cached") == 1, run.stderr[-2000:]


def test_a_cache_on_a_full_disk_still_compiles(tmp_path):
    # Writes past 4 KB fail as on a full disk (EFBIG, the signal ignored).
    setup = ("signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
             "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))")
    run = _run(tmp_path / "cache", sizes=(3, 4), setup=setup)
    assert "compiled executables are not cached" in run.stderr, run.stderr[-2000:]


def test_damaged_executables_are_compiled_again(tmp_path):
    cache = tmp_path / "cache"
    _run(cache, sizes=(3, 4))
    for entry in cache.glob("*.pjrt"):
        data = bytearray(entry.read_bytes())
        data[len(data) // 3] ^= 0x5A
        entry.write_bytes(bytes(data[: len(data) * 2 // 3]))
    _run(cache, sizes=(3, 4))
    assert tpuc.cache_stats(str(cache))["miss_reasons"].get("entry gone", 0) >= 1


def test_a_process_killed_while_filling_the_cache_leaves_it_usable(tmp_path):
    cache = tmp_path / "cache"
    # The kernel kills the process in the middle of writing its first entry: a file may not
    # grow past 4 KB, and going past it is a fatal signal (SIGXFSZ, default action). An entry
    # is larger, so the write was in progress when the process died.
    setup = ("signal.signal(signal.SIGXFSZ, signal.SIG_DFL)\n"
             "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))")
    run = _run(cache, sizes=range(2, 40), setup=setup, check=False)
    assert run.returncode == -signal.SIGXFSZ, (run.returncode, run.stderr[-2000:])
    cut_short = [entry for entry in os.scandir(cache) if ".tmp" in entry.name]
    assert cut_short and all(entry.stat().st_size == 4096 for entry in cut_short), os.listdir(cache)
    # Whatever it left (a temporary file cut short, entries, a record), the next run is right.
    _run(cache, sizes=(2, 3, 5, 8))


def test_an_archive_changed_after_saving_is_not_run_with_the_old_executable(tmp_path):
    x = torch.randn(2, 4)
    first = tpuc.compile_exported(torch.export.export(torch.nn.Linear(4, 3), (x,)), cache_dir="off")
    first.save(tmp_path / "saved")
    other = torch.nn.Linear(4, 3)
    torch.export.save(torch.export.export(other, (x,)), tmp_path / "saved" / "program.pt2")
    # Other weights, same program: the executable is the same one, and runs the new weights.
    torch.testing.assert_close(tpuc.load(tmp_path / "saved")(x), other(x).detach(), rtol=1e-5, atol=1e-5)
    bigger = torch.nn.Linear(4, 5)
    torch.export.save(torch.export.export(bigger, (x,)), tmp_path / "saved" / "program.pt2")
    with pytest.raises(tpuc.TpucError, match="recompile=True"):
        tpuc.load(tmp_path / "saved")
    torch.testing.assert_close(tpuc.load(tmp_path / "saved", recompile=True)(x), bigger(x).detach(),
                               rtol=1e-5, atol=1e-5)
