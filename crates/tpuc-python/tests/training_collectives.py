"""One training step (forward and backward) of the zoo's Llama compiled over a mesh, with XLA
dumping its optimized programs: prints, per compiled module in order, the collectives XLA's
optimized HLO holds, as one JSON line. Run by test_sharding.py in a process of its own (XLA
reads its flags when the plugin loads)."""
import glob
import json
import os
import sys
import tempfile

DUMP = tempfile.mkdtemp(prefix="tpuc-hlo-")
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={DUMP} --xla_dump_hlo_as_text"

import torch  # noqa: E402
from models import Llama  # noqa: E402

KINDS = ["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"]


def count(text: str) -> dict:
    lines = [line for line in text.splitlines() if " = " in line]
    return {k: sum(f" {k}(" in line or f" {k}-start(" in line for line in lines) for k in KINDS}


def main(mesh: str, plan: str) -> None:
    torch.manual_seed(0)
    model = Llama().train()
    options = {"mesh": mesh, "plan": plan, "strict": True, "cache_dir": "off", "hoist_weights": False}
    compiled = torch.compile(model, backend="tpuc", options=options)
    # A batch-major activation's rows (4 x 12) differ from every weight's dimensions.
    tokens = torch.randint(0, 64, (4, 12))
    compiled(tokens).square().mean().backward()
    modules = sorted(glob.glob(os.path.join(DUMP, "*after_optimizations.txt")))
    print(json.dumps([count(open(path).read()) for path in modules]))


if __name__ == "__main__":
    main(*sys.argv[1:])
