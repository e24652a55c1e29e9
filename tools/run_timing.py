"""`tpuc run --repeat` of an archive, and the times it reports: shared by the benchmarks that
compare compiled forms of one model in one run (tools/bench_repeated_block.py,
tools/bench_fusion.py)."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TPUC = os.path.join(ROOT, ".venv", "bin", "tpuc")
TIMES = re.compile(r"lower ([\d.]+) ms, .*compile ([\d.]+) ms, .*median ([\d.]+) ms")
TEMPORARIES = re.compile(r"([\d.]+) (B|KiB|MiB|GiB) of temporaries")
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def measure(path: str, repeat: int, out: str, *flags: str) -> tuple[float, float, float, float]:
    """tpuc's lowering, XLA's compile (the cache off) and the median repeated run of `path`
    (with `stem.inputs.npz`, checked against `stem.expected.npz`), in milliseconds; then the
    executable's temporaries (XLA's figure), in MiB."""
    stem = path[:-len(".pt2")]
    run = subprocess.run([TPUC, "run", path, "-i", stem + ".inputs.npz", "--expect", stem + ".expected.npz",
                          "--out", out, "--repeat", str(repeat), "--cache-dir", "off", *flags],
                         capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"tpuc run {path} {' '.join(flags)} failed:\n{run.stderr}")
    found = TIMES.search(run.stderr + run.stdout)
    if found is None:
        sys.exit(f"no timings in the output of tpuc run {path}:\n{run.stderr}")
    lower, compile_ms, steady = (float(g) for g in found.groups())
    memory = TEMPORARIES.search(run.stderr + run.stdout)
    temporaries = float(memory.group(1)) * UNITS[memory.group(2)] / (1 << 20) if memory else float("nan")
    return lower, compile_ms, steady, temporaries
