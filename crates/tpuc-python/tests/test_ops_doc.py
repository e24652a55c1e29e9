"""docs/ops.md and the core ATen list `tpuc ops` prints are generated from torch and tpuc's
registry; they must match what the installed torch and the built tpuc give now."""
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def test_coverage_table_is_current():
    script = os.path.join(ROOT, "tools", "gen_ops_doc.py")
    result = subprocess.run([sys.executable, script, "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr + result.stdout
