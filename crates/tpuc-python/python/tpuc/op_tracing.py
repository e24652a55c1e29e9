"""What the device needs of an op, whichever way it runs it: the op's schema (the arguments it
writes), the compiler of op programs, tracing with Python floats lifted to inputs (one program
for every value), why an op cannot run on the device, and warnings naming the user's line."""
from __future__ import annotations

import os
import warnings

import torch
from torch.utils._pytree import tree_flatten

from . import _tpuc
from .tolerance import difference

# A result that is a tensor, in an op's returns (the graph's next output).
TENSOR = object()

# Ops that write arguments their schemas do not mark as written, when the flag argument named is
# true: batch norm in training updates its running statistics in place (functionalization
# special-cases it too).
_UNMARKED_WRITES = {"aten::native_batch_norm": (("running_mean", "running_var"), "training")}


class Schema:
    """What the device needs of an op's schema, read once per op (`schema`)."""

    def __init__(self, func):
        arguments = func._schema.arguments
        self.names = [a.name for a in arguments]
        # The arguments it writes (in-place ops, `out=`), and of them the keyword-only `out=`s.
        self.written = [a.name for a in arguments if a.alias_info is not None and a.alias_info.is_write]
        self.unmarked_writes = _UNMARKED_WRITES.get(func._schema.name)
        self.outs = [a.name for a in arguments if a.kwarg_only and a.name in self.written]
        returns = func._schema.returns
        self.returns_list = bool(returns) and isinstance(returns[0].type, torch.ListType)
        self.returns_one = len(returns) == 1 and not self.returns_list

    def bind(self, args, kwargs) -> dict:
        return dict(zip(self.names, args)) | kwargs

    def written_tensors(self, args, kwargs) -> list:
        """The tensors the op writes, of these arguments, in the schema's order."""
        bound = self.bind(args, kwargs)
        names = self.written
        if self.unmarked_writes is not None and bound.get(self.unmarked_writes[1]):
            names = names + list(self.unmarked_writes[0])
        found = []
        for name in names:
            value = bound.get(name)
            if isinstance(value, torch.Tensor):
                found.append(value)
            elif isinstance(value, (list, tuple)):  # `Tensor(a!)[]`: the foreach and fused optimizer ops
                found += [item for item in value if isinstance(item, torch.Tensor)]
        return found


def schema(func) -> Schema:
    # Kept on the op itself: an attribute is cheaper than hashing the op on every call.
    found = getattr(func, "_tpuc_op_schema", None)
    if found is None:
        found = func._tpuc_op_schema = Schema(func)
    return found


_COMPILER = None


def compiler():
    """The graph compiler of the device's op programs (strict, weights not hoisted)."""
    global _COMPILER
    if _COMPILER is None:
        from .compiler import GraphCompiler
        from .options import Options
        _COMPILER = GraphCompiler(Options.parse({"strict": True, "hoist_weights": False}))
    return _COMPILER


# Two values no op computes from: an op traced with each of them, whose programs differ only
# where the values stand, takes its floats as plain operands.
_SENTINELS = (0.1234567890123457, 0.8765432109876543)


def lifted(func, flat, spec, trace, operands: bool = False) -> tuple[torch.fx.GraphModule, torch.dtype] | None:
    """`func` traced (by `trace(func, flat, spec)`, which traces it alone) with its Python floats
    as 0-dimensional inputs (and their dtype), when its traces with two sentinel values differ
    only where the values stand, each an operand an op takes as a tensor; None when not (a value
    that shapes the program, or one an op takes as a number). `operands`: the function traced is
    written to take every float as such an operand (the planner's stand-ins that say so), so one
    trace shows it (a second would only double the cost of a large op)."""
    floats = [i for i, v in enumerate(flat) if type(v) is float]
    tensors = [v for v in flat if isinstance(v, torch.Tensor)]
    if not floats or not tensors or not all(t.dtype.is_floating_point for t in tensors):
        return None
    # Each float its own stand-in, in each of the two traces.
    stand_ins = [[sentinel + k * 1e-9 for k in range(len(floats))] for sentinel in _SENTINELS[:1 if operands else 2]]
    traces, codes = [], []
    for values_of_floats in stand_ins:
        values = list(flat)
        for i, value in zip(floats, values_of_floats):
            values[i] = value
        try:
            gm = trace(func, values, spec)
        except Exception:  # noqa: BLE001 - a value the op refuses: it is not an operand
            return None
        code = gm.code
        for k, value in enumerate(values_of_floats):
            code = code.replace(repr(value), f"_lifted_{k}")
        traces.append(gm)
        codes.append(code)
    if codes[0] != codes[-1]:
        return None
    gm = traces[0]
    dtype = max((t.dtype for t in tensors), key=lambda d: torch.finfo(d).bits)
    marks = {value: k for k, value in enumerate(stand_ins[0])}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    # (A graph may have no input before them: an op on a storage never written reads zeros.)
    last = placeholders[-1] if placeholders else None
    inputs = []
    for k in range(len(floats)):
        # Each after the one before: the program's inputs are the floats in their order.
        place = gm.graph.inserting_after(last) if last is not None else gm.graph.inserting_before(None)
        with place:
            last = gm.graph.placeholder(f"lifted_{k}")
        last.meta["val"] = torch.empty((), dtype=dtype)
        inputs.append(last)
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        arguments = node.target._schema.arguments
        new_args = list(node.args)
        for j, value in enumerate(node.args):
            if type(value) is float and value in marks:
                if j >= len(arguments) or not isinstance(arguments[j].type, torch.TensorType):
                    return None
                new_args[j] = inputs[marks[value]]
        new_kwargs = dict(node.kwargs)
        for name, value in node.kwargs.items():
            if type(value) is float and value in marks:
                schema_arg = next((a for a in arguments if a.name == name), None)
                if schema_arg is None or not isinstance(schema_arg.type, torch.TensorType):
                    return None
                new_kwargs[name] = inputs[marks[value]]
        node.args, node.kwargs = tuple(new_args), new_kwargs
    gm.recompile()
    if any(repr(v) in gm.code for v in marks):
        return None
    return gm, dtype


def cannot_run(error: Exception) -> str | None:
    """Why an op whose trace or compile failed so cannot run on the device (and runs on the
    CPU); None for any other failure."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    if isinstance(error, (DataDependentOutputException, DynamicOutputShapeException)):
        return "what it returns depends on its tensors' values"
    if isinstance(error, _tpuc.UnsupportedOpsError):
        return "tpuc does not lower it"
    if isinstance(error, _tpuc.DynamicSizeError):
        return "its result's size depends on its tensors' values"
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
    if isinstance(error, GuardOnDataDependentSymNode):
        return "what it returns depends on its tensors' values"
    if isinstance(error, NotImplementedError) and "no fake impl or Meta kernel" in str(error):
        return "torch has no shape function for it"
    if isinstance(error, RuntimeError) and "mutating a non-functional tensor with a functional tensor" in str(error):
        return "torch cannot make it functional"  # the fused optimizer ops that write lists of tensors
    return None


def falls_back(func, reason: str, error: Exception) -> None:
    """Says once that `func` runs on the CPU instead; an error under TPUC_STRICT=1."""
    if os.environ.get("TPUC_STRICT") == "1":
        raise _tpuc.TpucError(f"{func} cannot run on the tpuc device: {reason} (TPUC_STRICT=1): {error}") from error
    warn(f"tpuc: {func} cannot run on the tpuc device ({reason}); it runs on the CPU (its tensors copied "
          "there and back)")


def user_frame():
    """The innermost frame of the caller's code (outside torch and tpuc) running now, if any."""
    import sys
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        if "/torch/" not in path and "/tpuc/" not in path and not path.startswith("<"):
            return frame
        frame = frame.f_back
    return None


def user_line() -> str:
    """The innermost line of the caller's code (outside torch and tpuc) running now."""
    import linecache
    frame = user_frame()
    if frame is None:
        return "(no line outside torch)"
    path, line = frame.f_code.co_filename, frame.f_lineno
    return f"{path}:{line}: {linecache.getline(path, line).strip()}"


def warn(message: str) -> None:
    """A warning attributed to the caller's line (outside torch and tpuc)."""
    frame = user_frame()
    if frame is None:
        warnings.warn(message, stacklevel=2)
        return
    warnings.warn_explicit(message, UserWarning, frame.f_code.co_filename, frame.f_lineno,
                           module=frame.f_globals.get("__name__"),
                           registry=frame.f_globals.setdefault("__warningregistry__", {}),
                           module_globals=frame.f_globals)


def check_results(func, cpu_args, cpu_kwargs, got: list, mutated: bool, *, finite: bool, compare: bool,
                  rtol: float, atol: float) -> None:
    """Debug mode's checks of `func`'s results `got` (host copies: the new values of what it
    writes when `mutated`), given its arguments on the host: no NaN or infinity made from finite
    inputs (`finite`); within `rtol`/`atol` of the CPU's results (`compare`). An error names the
    op and the user's line."""
    if finite:
        inputs_finite = all(bool(torch.isfinite(t).all()) for t in tree_flatten((cpu_args, cpu_kwargs))[0]
                            if isinstance(t, torch.Tensor) and t.is_floating_point())
        for value in got:
            if inputs_finite and value.is_floating_point() and not bool(torch.isfinite(value).all()):
                raise _tpuc.TpucError(f"{func} made a NaN or an infinity from finite inputs, at {user_line()}")
    if compare:
        result = func(*cpu_args, **cpu_kwargs)
        if mutated:
            expected = schema(func).written_tensors(cpu_args, cpu_kwargs)
        else:
            expected = [r for r in tree_flatten(result)[0] if isinstance(r, torch.Tensor)]
        for value, want in zip(got, expected):
            found = difference(value, want, rtol, atol)
            if found is not None:
                raise _tpuc.TpucError(f"{func} differs from the CPU's result by {found}, at {user_line()}")
