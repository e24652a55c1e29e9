#!/usr/bin/env python3
"""Soak and concurrency runs of the torch.compile backend, with resident memory measured:

- calls:      CALLS calls of one compiled model (an MLP, batch 32); resident memory after a
              warm-up and at the end (flat: bounded growth).
- recompiles: RECOMPILES graphs of distinct shapes compiled one after another (Dynamo's cache
              reset every 50, so that what stays is tpuc's: its in-process cache keeps the 256
              most recently used executables); resident memory as it goes.
- threads:    4 Python threads at once, each calling a compiled model it shares with the others
              and compiling new ones, every result checked.

Prints one JSON line per part; exits non-zero when a result is wrong or memory grows past the
bound given (--max-growth-mb, for the calls part). A subset runs in the test suite
(crates/tpuc-python/tests/test_soak.py).

--backend eager runs the recompiles part on Dynamo's "eager" backend instead (no compiler at all):
the memory Dynamo and aot_autograd keep per graph, the baseline that tpuc's figure compares with.

usage: soak.py [--calls 100000] [--recompiles 1000] [--threads-rounds 50] [--parts ...] [--backend tpuc|eager]
"""
import argparse
import json
import os
import sys
import threading

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
if "TPUC_CACHE_DIR" not in os.environ:
    # A thousand graphs would fill the user's cache of compiled executables: a cache of its own.
    import atexit
    import shutil
    import tempfile

    _CACHE = tempfile.mkdtemp(prefix="tpuc-soak-cache-")
    os.environ["TPUC_CACHE_DIR"] = _CACHE
    atexit.register(shutil.rmtree, _CACHE, True)

import torch  # noqa: E402


def resident_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def soak_calls(calls: int) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 16))
    compiled = torch.compile(model, backend="tpuc")
    x = torch.randn(32, 64)
    want = model(x).detach()
    warmup = min(1000, calls // 10)
    with torch.no_grad():
        for _ in range(warmup):
            compiled(x)
        start = resident_mb()
        marks = []
        for i in range(calls):
            got = compiled(x)
            if (i + 1) % max(calls // 10, 1) == 0:
                marks.append(round(resident_mb(), 1))
    ok = torch.allclose(got, want, atol=1e-5)
    end = resident_mb()
    return {"part": "calls", "calls": calls, "resident_mb_start": round(start, 1), "resident_mb_end": round(end, 1),
            "growth_mb": round(end - start, 1), "marks_mb": marks, "results_right": bool(ok)}


def soak_recompiles(count: int, backend: str) -> dict:
    import torch._dynamo

    from tpuc.runtime import STATS

    def fn(x):
        return (x.sin() * 2 + 1).sum(0)

    # Each of the 50 shapes between resets is compiled (not left to eager past Dynamo's limit).
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit,
                                                           count + 64)
    compiles = STATS["compiles"]
    marks = {}
    ok = True
    start = None
    for i in range(count):
        if i % 50 == 0:
            torch._dynamo.reset()
            compiled = torch.compile(fn, backend=backend, dynamic=False)
        x = torch.randn(i % 97 + 1, i // 97 + 1)
        ok &= bool(torch.allclose(compiled(x), fn(x), atol=1e-4))
        if i == 99:
            start = resident_mb()
        if (i + 1) in (100, count // 4, count // 2, count):
            marks[i + 1] = round(resident_mb(), 1)
    # Shapes repeat after 97 x 11 graphs; below that, every graph is a compile.
    if backend == "tpuc":
        ok &= STATS["compiles"] - compiles >= min(count, 1000)
    return {"part": "recompiles", "backend": backend, "graphs": count, "compiled": STATS["compiles"] - compiles, "resident_mb_at": marks,
            "growth_mb_after_100": round(resident_mb() - (start or resident_mb()), 1), "results_right": ok}


def soak_threads(rounds: int) -> dict:
    torch.manual_seed(0)
    shared = torch.nn.Linear(16, 8)
    compiled_shared = torch.compile(shared, backend="tpuc")
    failures: list = []

    def worker(index: int) -> None:
        try:
            own = torch.compile(lambda v, k=index: (v * (k + 1)).cos(), backend="tpuc", dynamic=False)
            for r in range(rounds):
                x = torch.randn(4 + index, 16)
                with torch.no_grad():
                    if not torch.allclose(compiled_shared(x), shared(x), atol=1e-5):
                        failures.append(f"thread {index}: the shared model's result is wrong at round {r}")
                if r % 10 == 0:  # a new shape: a new graph compiled while the others run
                    y = torch.randn(r // 10 + 2, 3)
                    if not torch.allclose(own(y), (y * (index + 1)).cos(), atol=1e-5):
                        failures.append(f"thread {index}: its own graph's result is wrong at round {r}")
        except Exception as e:  # noqa: BLE001 - reported, then the run fails
            failures.append(f"thread {index}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    hung = [i for i, t in enumerate(threads) if t.is_alive()]
    return {"part": "threads", "threads": 4, "rounds": rounds, "hung": hung, "failures": failures[:5],
            "results_right": not failures and not hung}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--recompiles", type=int, default=1000)
    parser.add_argument("--threads-rounds", type=int, default=50)
    parser.add_argument("--max-growth-mb", type=float, default=64.0)
    parser.add_argument("--backend", default="tpuc", choices=["tpuc", "eager"],
                        help="the recompiles part's backend (eager: Dynamo's own, the baseline)")
    parser.add_argument("--parts", nargs="+", default=["calls", "recompiles", "threads"],
                        choices=["calls", "recompiles", "threads"])
    args = parser.parse_args()
    failed = False
    for part in args.parts:
        if part == "calls":
            result = soak_calls(args.calls)
            failed |= result["growth_mb"] > args.max_growth_mb
        elif part == "recompiles":
            result = soak_recompiles(args.recompiles, args.backend)
        else:
            result = soak_threads(args.threads_rounds)
        failed |= not result["results_right"]
        print(json.dumps(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
