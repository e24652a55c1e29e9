import atexit
import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The tests' own cache of compiled executables, not the user's: a graph compiled by an earlier
# test (or process) is loaded from it, so loaded executables are exercised too.
if "TPUC_CACHE_DIR" not in os.environ:
    os.environ["TPUC_CACHE_DIR"] = tempfile.mkdtemp(prefix="tpuc-test-cache-")
    atexit.register(shutil.rmtree, os.environ["TPUC_CACHE_DIR"], True)

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch, single-threaded torch for stable comparisons."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()
