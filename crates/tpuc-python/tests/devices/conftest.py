"""Tests of several devices: they run in a process of their own whose CPU plugin has two devices
(TPUC_DEVICES=2, read when the device starts); tools/test.sh runs them so."""
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # models.py

if os.environ.get("TPUC_DEVICES") != "2":
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(autouse=True)
def seeded():
    import torch
    torch.manual_seed(0)
    yield
