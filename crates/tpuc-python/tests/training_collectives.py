"""One training step (forward and backward) of the zoo's Llama, or the forward of its RNN written
with scan (`rnn`), compiled over a mesh (the fusion stage as given last, `none` by default), with
XLA dumping its optimized programs: prints, per compiled module in order, the collectives XLA's
optimized HLO holds, as one JSON line. Run by test_sharding.py in a process of its own (XLA reads
its flags when the plugin loads)."""
import glob
import json
import os
import re
import sys
import tempfile

DUMP = tempfile.mkdtemp(prefix="tpuc-hlo-")
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={DUMP} --xla_dump_hlo_as_text"

import torch  # noqa: E402
from models import Llama, Rnn  # noqa: E402

KINDS = ["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"]


def count(text: str) -> dict:
    lines = [line for line in text.splitlines() if " = " in line]
    return {k: sum(f" {k}(" in line or f" {k}-start(" in line for line in lines) for k in KINDS}


def in_loop_bodies(text: str) -> int:
    """How many collectives the bodies of the program's while loops hold (each runs per step)."""
    bodies = set(re.findall(r"body=%([\w.\-]+)", text))
    computations = re.split(r"\n(?=%|ENTRY )", text)
    return sum(sum(count(c).values()) for c in computations
               if c.startswith("%") and c[1:].split(" ", 1)[0] in bodies)


def main(mesh: str, plan: str, model: str = "llama", fusion: str = "none") -> None:
    torch.manual_seed(0)
    options = {"mesh": mesh, "plan": plan, "strict": True, "cache_dir": "off", "hoist_weights": False,
               "fusion": fusion}
    if model == "rnn":
        with torch.no_grad():
            torch.compile(Rnn(), backend="tpuc", options=options)(torch.randn(4, 6, 3), torch.randn(4, 4))
    else:
        compiled = torch.compile(Llama().train(), backend="tpuc", options=options)
        # A batch-major activation's rows (4 x 12) differ from every weight's dimensions.
        tokens = torch.randint(0, 64, (4, 12))
        compiled(tokens).square().mean().backward()
    modules = sorted(glob.glob(os.path.join(DUMP, "*after_optimizations.txt")))
    texts = [open(path).read() for path in modules]
    print(json.dumps([dict(count(t), **{"in loops": in_loop_bodies(t)}) for t in texts]))


if __name__ == "__main__":
    main(*sys.argv[1:])
