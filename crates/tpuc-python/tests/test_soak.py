"""A short run of tools/soak.py (the long one's figures are in its output): calls of a compiled
model with resident memory flat, graphs of distinct shapes compiled one after another, and four
threads calling and compiling at once, every result right."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_a_short_soak_stays_flat_and_right(tmp_path):
    run = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "soak.py"), "--calls", "5000",
                          "--recompiles", "60", "--threads-rounds", "20", "--max-growth-mb", "32"],
                         capture_output=True, text=True, timeout=900, cwd=tmp_path,
                         env=dict(os.environ, TPUC_CACHE_DIR=str(tmp_path / "cache")))
    parts = {r["part"]: r for r in map(json.loads, (line for line in run.stdout.splitlines() if line.startswith("{")))}
    assert run.returncode == 0, (parts, run.stderr[-3000:])
    assert sorted(parts) == ["calls", "recompiles", "threads"], run.stdout
    assert parts["calls"]["growth_mb"] <= 32 and parts["recompiles"]["compiled"] >= 60, parts
    assert parts["threads"]["hung"] == [] and parts["threads"]["failures"] == [], parts
