#!/usr/bin/env python3
"""torch.compile backends compared on this machine: eager, inductor and tpuc.

For each thread count (the process is pinned to that many cores and torch uses that many
threads), each model and each backend: the first call (compile included) and the steady-state
latency (median of timed calls after warm-up). Models: a tiny graph (per-call overhead), a Llama
block (batch 1, seq 128, hidden 256, fp32) and ResNet-18 (batch 1, 3x224x224). Inference under
torch.no_grad. Run on an idle machine: tools/bench_backend.sh.

usage: bench_backend.py [--threads 1 2] [--models tiny llama_block resnet18] [--json OUT]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "crates", "tpuc-python", "tests"))


def build(name):
    import torch

    torch.manual_seed(0)
    if name == "tiny":
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
        return model.eval(), (torch.randn(1, 8),)
    if name == "llama_block":
        from models import DecoderBlock

        return DecoderBlock(256, heads=8, kv_heads=4, hidden=688).eval(), (torch.randn(1, 128, 256),)
    if name == "resnet18":
        from models import resnet18

        return resnet18().eval(), (torch.randn(1, 3, 224, 224),)
    raise ValueError(name)


def measure(model_name, backend, threads):
    """One (model, backend) in this process: first-call seconds and steady-state seconds."""
    import torch

    torch.set_num_threads(threads)
    model, inputs = build(model_name)
    fn = model if backend == "eager" else torch.compile(model, backend=backend)
    with torch.no_grad():
        start = time.perf_counter()
        fn(*inputs)
        first = time.perf_counter() - start
        for _ in range(5):
            fn(*inputs)
        # About two seconds of timed calls, at least 20.
        probe = time.perf_counter()
        fn(*inputs)
        single = max(time.perf_counter() - probe, 1e-6)
        count = max(20, min(2000, int(2.0 / single)))
        times = []
        for _ in range(count):
            start = time.perf_counter()
            fn(*inputs)
            times.append(time.perf_counter() - start)
    return {"first_call_s": first, "steady_s": statistics.median(times), "calls": count}


def child(args):
    os.sched_setaffinity(0, set(range(args.threads)))
    result = measure(args.model, args.backend, args.threads)
    print(json.dumps(result))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--models", nargs="+", default=["tiny", "llama_block", "resnet18"])
    parser.add_argument("--backends", nargs="+", default=["eager", "inductor", "tpuc"])
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--threads-one", type=int, dest="threads_one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.threads = args.threads_one
        return child(args)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    results = []
    print(f"{'threads':>7} {'model':<12} {'backend':<9} {'first call':>11} {'steady':>10}  vs eager")
    for threads in args.threads:
        for model in args.models:
            eager = None
            for backend in args.backends:
                # Each measurement in a fresh process: no shared caches or thread pools.
                out = subprocess.run(
                    [sys.executable, __file__, "--child", "--model", model, "--backend", backend,
                     "--threads-one", str(threads)],
                    capture_output=True, text=True, env=env,
                )
                if out.returncode != 0:
                    print(f"{threads:>7} {model:<12} {backend:<9} FAILED: {out.stderr.strip().splitlines()[-1:]}")
                    continue
                r = json.loads(out.stdout.strip().splitlines()[-1])
                r.update(threads=threads, model=model, backend=backend)
                results.append(r)
                if backend == "eager":
                    eager = r["steady_s"]
                ratio = f"{r['steady_s'] / eager:.2f}x" if eager else ""
                print(f"{threads:>7} {model:<12} {backend:<9} {r['first_call_s']:>10.2f}s "
                      f"{r['steady_s'] * 1e3:>8.3f}ms  {ratio}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
