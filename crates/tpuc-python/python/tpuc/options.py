"""Options of the tpuc backend, from torch.compile(..., options={...}) and the environment."""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

from . import _tpuc


@dataclasses.dataclass(frozen=True)
class Options:
    """How the backend compiles.

    plugin:           PJRT plugin: "cpu", "tpu", "cuda" or a path (default $TPUC_PJRT_PLUGIN, else cpu).
    decompositions:   "core" (torch's core-ATen decompositions, default) or "none" (the ATen ops
                      aot_autograd produces, undecomposed).
    keep_whole:       op overloads excluded from decomposition so the lowering sees them whole,
                      e.g. ("aten.silu.default",). Attention on CPU tensors
                      (aten._scaled_dot_product_flash_attention_for_cpu) is always lowered whole;
                      its backward is decomposed by tpuc.decompositions.
    strict:           an op tpuc cannot lower is an error instead of an eager fallback
                      (also TPUC_STRICT=1).
    dump_dir:         write each compiled graph's FX graph, StableHLO and compile times there
                      (also TPUC_DUMP_DIR).
    matmul_precision: "highest" (default; what torch computes), "high" or "default".
    fusion:           "kernels" (default): named patterns (RMSNorm, attention, ...) become
                      stablehlo.composite ops tpuc.<pattern>, each computed by tpuc's
                      formulation for the plugin where it has one (long attention in blocks of
                      keys, grouped-query attention without repeated copies), else by the ops
                      matched; "patterns": the composites, computed by the ops matched, so that
                      a backend may run its own kernel for them; "none": every op as lowered
                      (also TPUC_FUSION, which the tpuc device's programs follow too).
    hoist_weights:    compute what a forward graph derives from the model's parameters and
                      buffers alone once per version of them instead of on every call: convolution
                      kernels in the layout the plugin's convolutions read, batch norm scales and
                      shifts, other arithmetic on weights (default True). Costs the memory of those
                      values (for a convolutional network about one more copy of its kernels).
                      A weight counts as changed after an in-place update (its version changes); a
                      change made through `.data` leaves the version as it is and is not seen here.
                      In training the weights change every step, and so are these values.
    mesh:             run over a mesh of devices, "fsdp=2,tp=2" or a tpuc.Mesh (on the CPU plugin,
                      that many devices share the host's cores); one device when None.
    plan:             how inputs and parameters are laid out over the mesh where they are not
                      marked (tpuc.mark_sharding, tpuc.shard): "dp", "fsdp", "tp" or a combination
                      ("fsdp,tp"), each over the mesh axis of its name, or a dict of rules
                      {"rules": {pattern: spec}, "ready": "dp"}; everything whole when None.
                      See docs/sharding.md.
    buckets:          how graphs with dynamic sizes (dynamic=True, automatic dynamic shapes,
                      mark_dynamic) are compiled: each size rounded up to its bucket, the inputs
                      padded to it and the graph made exact under that padding, one executable
                      per bucket: "pow2" (powers of two from 16, default), "pow2:MIN", a list of
                      sizes such as [64, 128, 256] or "64,128,256" (a size above the largest is
                      its own bucket), or "off" (one executable per size). A graph with an op
                      padding would change and tpuc cannot make exact is compiled per size, said
                      once. See docs/buckets.md.
    compare:          a debugging aid: every call of a compiled graph is checked against PyTorch
                      on the CPU, and when an output differs, the graph's nodes are run one by one
                      on the tpuc device against the CPU to name the first node whose result
                      diverges, with the line of the user's code that made it. True (rtol 1e-4,
                      atol 1e-5) or {"rtol": ..., "atol": ...}; off by default (it costs an eager
                      run of each graph per call).
    cache_dir:        where compiled executables are kept between processes, so that a graph
                      compiled once is loaded instead of compiled again (default
                      $TPUC_CACHE_DIR, else $XDG_CACHE_HOME/tpuc or ~/.cache/tpuc; "off" for no
                      cache). Its size is kept under $TPUC_CACHE_MAX_MB megabytes (default 1024),
                      least recently used executables going first.
    """

    plugin: str | None = None
    decompositions: str = "core"
    keep_whole: tuple[str, ...] = ()
    strict: bool = False
    dump_dir: str | None = None
    matmul_precision: str = "highest"
    fusion: str = _tpuc.DEFAULT_FUSION
    hoist_weights: bool = True
    mesh: Any = None
    plan: Any = None
    buckets: Any = "pow2"
    cache_dir: str | None = None
    compare: Any = None

    @staticmethod
    def parse(given: dict[str, Any] | None) -> "Options":
        given = dict(given or {})
        known = {f.name for f in dataclasses.fields(Options)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ValueError(f"unknown tpuc option(s) {unknown}; known: {sorted(known)}")
        env_strict = os.environ.get("TPUC_STRICT", "") not in ("", "0")
        values = {
            "strict": env_strict,
            "dump_dir": os.environ.get("TPUC_DUMP_DIR") or None,
            "fusion": os.environ.get("TPUC_FUSION") or _tpuc.DEFAULT_FUSION,
        }
        values.update(given)
        if "keep_whole" in values:
            values["keep_whole"] = tuple(values["keep_whole"])
        options = Options(**values)
        if options.decompositions not in ("core", "none"):
            raise ValueError(f"decompositions must be 'core' or 'none', not {options.decompositions!r}")
        if options.mesh is not None:
            options = dataclasses.replace(options, mesh=_tpuc.Mesh.of(options.mesh),
                                          plan=None if options.plan is None else _tpuc.Plan(options.plan))
        elif options.plan is not None:
            raise ValueError("the option plan needs a mesh, e.g. options={'mesh': 'fsdp=2,tp=2', 'plan': 'fsdp,tp'}")
        options = dataclasses.replace(options, compare=_tolerance(options.compare))
        options.compile  # noqa: B018 (checked here, once)
        return options

    @functools.cached_property
    def compile(self) -> _tpuc.CompileOptions:
        """What every graph's compilation takes from these options, checked by the extension."""
        return _tpuc.CompileOptions(matmul_precision=self.matmul_precision, cache_dir=self.cache_dir,
                                    buckets=self.buckets, fusion=self.fusion)


def _tolerance(given) -> tuple[float, float] | None:
    """The compare option as (rtol, atol), None when off."""
    if given is None or given is False:
        return None
    if given is True:
        return (1e-4, 1e-5)
    if isinstance(given, dict) and set(given) <= {"rtol", "atol"} and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in given.values()):
        return (float(given.get("rtol", 1e-4)), float(given.get("atol", 1e-5)))
    raise ValueError(f"compare must be True, False or {{'rtol': ..., 'atol': ...}} with numbers >= 0, not {given!r}")
