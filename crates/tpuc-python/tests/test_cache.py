"""The cache of compiled executables explains itself: statistics from its record (requests, hits,
misses by reason, compile time), a mode in which a miss is an error, misses' modules dumped,
caches shared read-only, and processes filling one cache at once."""
import json
import os
import subprocess
import sys

import tpuc

PROGRAM = """
import json, sys, torch, tpuc
fn = {body!r}
f = torch.compile(eval(fn), backend="tpuc")
f(torch.ones({size}))
"""


def _compile(cache, body="lambda x: x.sin() * 2", size=3, check=True, **env):
    run = subprocess.run([sys.executable, "-c", PROGRAM.format(body=body, size=size)], capture_output=True,
                         text=True, timeout=300,
                         env=dict(os.environ, TPUC_CACHE_DIR=str(cache), TF_CPP_MIN_LOG_LEVEL="3", **env))
    if check:
        assert run.returncode == 0, run.stderr[-3000:]
    return run


def test_each_miss_says_why_and_the_statistics_add_up(tmp_path):
    cache = tmp_path / "cache"
    _compile(cache)                                   # a new graph
    _compile(cache)                                   # a hit, in a new process
    _compile(cache, XLA_FLAGS="--xla_cpu_enable_fast_math=false")  # the plugin's flags changed
    stats = tpuc.cache_stats(str(cache))
    assert (stats["requests"], stats["hits"], stats["misses"], stats["refused"]) == (3, 1, 2, 0), stats
    assert stats["miss_reasons"] == {"new graph": 1, "changed: XLA flags": 1}, stats
    assert stats["compile_seconds"] > 0
    assert tpuc.cache_stats("off") is None


def test_a_cache_that_must_not_compile_refuses_and_misses_can_be_dumped(tmp_path):
    cache, dumps = tmp_path / "cache", tmp_path / "dumps"
    _compile(cache, TPUC_CACHE_DUMP_MISSES=str(dumps))
    assert [p.suffix for p in dumps.iterdir()] == [".mlir"]
    assert "stablehlo" in next(dumps.iterdir()).read_text()
    _compile(cache, TPUC_CACHE_MODE="require")        # compiled before: served
    refused = _compile(cache, body="lambda x: x.cos() + 1", check=False, TPUC_CACHE_MODE="require")
    assert refused.returncode != 0
    assert "is not in the cache of compiled executables" in refused.stderr
    assert "TPUC_CACHE_MODE=require forbids compiling it" in refused.stderr
    assert tpuc.cache_stats(str(cache))["refused"] == 1
    bad = _compile(cache, check=False, TPUC_CACHE_MODE="sometimes")
    assert "TPUC_CACHE_MODE is normal or require" in bad.stderr


def test_a_shared_cache_serves_a_machine_that_writes_its_own(tmp_path):
    shared, local = tmp_path / "shared", tmp_path / "local"
    _compile(shared)                                  # filled "elsewhere"
    before = sorted((p.name, p.stat().st_mtime_ns) for p in shared.iterdir())
    _compile(local, TPUC_CACHE_SHARED=str(shared), TPUC_CACHE_MODE="require")
    _compile(local, body="lambda x: x.exp()", TPUC_CACHE_SHARED=str(shared))  # a miss: stored locally
    assert sorted((p.name, p.stat().st_mtime_ns) for p in shared.iterdir()) == before, "the shared cache was written"
    assert len([p for p in local.iterdir() if p.suffix == ".pjrt"]) == 1
    stats = tpuc.cache_stats(str(local))
    assert (stats["hits"], stats["misses"]) == (1, 1), stats


def test_two_processes_fill_one_cache_at_once(tmp_path):
    cache = tmp_path / "cache"
    script = PROGRAM.format(body="lambda x: (x.sin() * 2, x.cos())", size=3) + "\n" + \
        "for n in range(4, 9):\n    f(torch.ones(n))\n"
    env = dict(os.environ, TPUC_CACHE_DIR=str(cache), TF_CPP_MIN_LOG_LEVEL="3")
    runs = [subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True, env=env)
            for _ in range(2)]
    for run in runs:
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-3000:]
    stats = tpuc.cache_stats(str(cache))
    assert stats["requests"] == stats["hits"] + stats["misses"] and stats["requests"] >= 4, stats
    # Every entry they left is sound: a third process finds all it needs.
    _compile(cache, body="lambda x: (x.sin() * 2, x.cos())", TPUC_CACHE_MODE="require")
    with open(cache / "stats.jsonl") as record:
        assert all(json.loads(line)["graph"] for line in record)
