"""The native device's tests: they run in a process whose device is the native layer
(TPUC_NATIVE=1, set before torch loads tpuc) with two devices (TPUC_DEVICES=2); tools/test.sh
runs them so."""
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # models.py

if os.environ.get("TPUC_NATIVE") != "1":
    # Only one backend can hold PyTorch's PrivateUse1 device in a process.
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(autouse=True)
def seeded():
    import torch
    torch.manual_seed(0)
    yield
