"""The native device's planner: what an op does on the device, decided on the first call of its
key (its arguments' dtypes, layouts and non-tensor values) and kept by the native layer, which
runs every later call without Python (native/ops.cpp).

An op's program works on storages, not views: each storage a tensor argument lies in is one input
(its whole value), the op reads its tensors out of them (a view of the storage's elements), and
every storage it writes is an output (its new whole value, the written elements scattered in).
So views, in-place ops and `out=` arguments behave as on any device with memory, and the program
is compiled once for those layouts.

A plan is a tuple the native layer reads (module.cpp `parse_plan`):
- `("program", compiled, inputs, writes, returns, lifted, count, graph)`, `compiled` being
  `(program, constants, outputs, results, random)` and `graph` the number fused mode knows the
  op's graph by (`fusion.fuse`);
- `("view", returns)`: a view op with no kernel of its own, its layouts from torch's meta kernels;
- `("host",)`: an op tpuc cannot run on the device, run by torch on the host (`run_on_host`).

Programs' plans are also kept on disk (`plan_store`), so that a second process revives them
(its executables loaded from the compile cache) instead of tracing and lowering each op again.
"""
from __future__ import annotations

import concurrent.futures
import functools
import math
import os
import time

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from . import _tpuc, _tpuc_native, kernels, op_tracing, plan_store
from .accelerator import NAME
from .runtime import dtype_name, session

# What the planner did (`native_device.cache_stats` adds the native layer's hits).
# `plans` counts every op's entry, `plans_from_disk` those of them revived from `plan_store`
# (`fused_runs_from_disk` the same of `fused_runs_planned`); `loaded_from_disk` the executables the
# compile cache served.
STATS = {"plans": 0, "plans_from_disk": 0, "fused_runs_planned": 0, "fused_runs_from_disk": 0,
         "loaded_from_disk": 0, "host_ops": 0, "plan_seconds": 0.0}


def op_of(name: str, overload: str):
    """The op the native layer names `ns::name` and `overload`."""
    namespace, _, op_name = name.partition("::")
    packet = getattr(getattr(torch.ops, namespace), op_name)
    return getattr(packet, overload or "default")


def bind(func, arguments: list) -> tuple[list, dict, set]:
    """The boxed arguments (every one, in the schema's order) as a call's positional and
    keyword arguments, and the ids of the numbers among them made tensors again: a number the
    dispatcher wrapped for a Tensor argument (`special_hermite_polynomial_h(x, 3)` reaching its
    `out=` form) comes to Python as the number, which only some ops take for a tensor. Floats
    stay numbers (those ops take them, and a float is lifted to an input: `op_tracing.lifted`)."""
    positional, keywords, numbers = [], {}, set()
    for schema_argument, value in zip(func._schema.arguments, arguments):
        if (type(value) in (int, bool, complex) and isinstance(schema_argument.type, torch.TensorType)):
            value = torch.tensor(value)
            numbers.add(id(value))
        if schema_argument.kwarg_only:
            keywords[schema_argument.name] = value
        else:
            positional.append(value)
    return positional, keywords, numbers


def on_device(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == NAME


def to_host(value):
    """A device tensor's copy on the host; any other value as it is."""
    return value.cpu() if on_device(value) else value


class _Layout:
    """A device tensor as its op's program sees it: the storage it lies in (the program's input
    `input`), that storage's value (`dims`, `dtype`) and the tensor's place in it."""

    __slots__ = ("input", "dims", "dtype", "plain", "unwritten")

    def __init__(self, tensor: torch.Tensor, input_index: int, storage: _Layout | None = None):
        """`input_index`: the storage's place among the values the op's trace reads
        (`_Signature.values`); `storage`: the layout of another tensor in the same storage,
        whose value it shares."""
        if storage is not None:
            dims, dtype, self.unwritten = storage.dims, storage.dtype, storage.unwritten
        else:
            dims, dtype, nbytes = _tpuc_native.storage_layout(tensor)
            self.unwritten = dims is None
            if self.unwritten:  # zeros of the tensor's dtype (as storage.cpp `value_or_zeros` makes them)
                covers = (tensor.storage_offset() == 0 and tensor.is_contiguous()
                          and tensor.numel() * tensor.element_size() == nbytes)
                dims, dtype = (list(tensor.shape) if covers else [nbytes // tensor.element_size()]), tensor.dtype
        self.input, self.dims, self.dtype = input_index, list(dims), dtype
        self.plain = (tensor.storage_offset() == 0 and list(tensor.shape) == self.dims
                      and dtype == tensor.dtype and tensor.is_contiguous())


def _reinterpret(flat: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A one-dimensional value's bytes read as `dtype` (complex numbers as pairs of their real
    type, which is how tpuc lowers their views)."""
    if flat.dtype == dtype:
        return flat
    if dtype.is_complex and not flat.dtype.is_complex and flat.dtype == dtype.to_real():
        return torch.view_as_complex(flat.reshape(-1, 2))
    if flat.dtype.is_complex and not dtype.is_complex and dtype == flat.dtype.to_real():
        return torch.view_as_real(flat).reshape(-1)
    return flat.view(dtype)


def _read(storage: torch.Tensor, tensor: torch.Tensor, layout: _Layout) -> torch.Tensor:
    """The tensor's elements out of its storage's value."""
    if layout.plain:
        return storage
    flat = _reinterpret(storage.reshape(-1), tensor.dtype)
    offset = tensor.storage_offset()
    if tensor.is_contiguous():
        return flat[offset:offset + tensor.numel()].view(tensor.shape)
    if tensor.dtype.is_complex:  # tpuc lowers strided views of real numbers: of the pairs
        pairs = torch.view_as_real(flat).reshape(-1)
        return torch.view_as_complex(pairs.as_strided(*_strided_pairs(tensor)))
    box = _Box.of(tensor)
    if box is not None:
        return box.read(flat)
    return flat.as_strided(tensor.shape, tensor.stride(), offset)


def _strided_pairs(tensor: torch.Tensor) -> tuple[list, list, int]:
    """A complex tensor's place in its storage as (sizes, strides, offset) of its real pairs."""
    return ([*tensor.shape, 2], [2 * s for s in tensor.stride()] + [1], 2 * tensor.storage_offset())


def _written(storage: torch.Tensor, value: torch.Tensor, tensor: torch.Tensor, layout: _Layout) -> torch.Tensor:
    """The storage's new value with `value` written where `tensor` lies in it."""
    if layout.plain:
        return value.expand(tensor.shape).to(tensor.dtype).clone()
    flat = _reinterpret(storage.reshape(-1), tensor.dtype)
    value = value.expand(tensor.shape).to(tensor.dtype)
    offset = tensor.storage_offset()
    if tensor.is_contiguous():
        new = torch.slice_scatter(flat, value.reshape(-1), 0, offset, offset + tensor.numel())
    elif tensor.dtype.is_complex:
        pairs = torch.view_as_real(flat).reshape(-1)
        new = torch.as_strided_scatter(pairs, torch.view_as_real(value.contiguous()), *_strided_pairs(tensor))
        new = torch.view_as_complex(new.reshape(-1, 2))
    elif (box := _Box.of(tensor)) is not None and box.writable:
        new = box.write(flat, value)
    else:
        new = torch.as_strided_scatter(flat, value, tensor.shape, tensor.stride(), offset)
    return _reinterpret(new, layout.dtype).reshape(layout.dims)


class _Box:
    """A strided view (a transpose, a slice, every other element, a broadcast) as the leading
    corner of a box of its storage's elements, permuted: read and written with reshapes, slices
    and permutations, which XLA fuses, rather than the gather and scatter `as_strided` lowers to.

    The view's dimensions of size 1 or stride 0 (broadcast) aside, ordered by decreasing stride
    s_0 > ... > s_m with sizes n_0..n_m, the box is the storage's elements from the view's offset
    on, shaped (n_0, s_0/s_1, ..., s_(m-1)/s_m, s_m): each stride a multiple of the next, the
    view takes the first n_k of dimension k and element 0 of the last."""

    __slots__ = ("sizes", "offset", "order", "shape")

    def __init__(self, sizes: list, offset: int, order: list, shape: list):
        self.sizes, self.offset, self.order, self.shape = sizes, offset, order, shape

    @staticmethod
    def of(tensor: torch.Tensor) -> _Box | None:
        sizes, strides = list(tensor.shape), list(tensor.stride())
        if tensor.numel() == 0 or any(s < 0 for s in strides):
            return None
        order = sorted((d for d in range(len(sizes)) if sizes[d] != 1 and strides[d] != 0),
                       key=lambda d: -strides[d])
        shape = [sizes[order[0]]] if order else [1]
        for outer, inner in zip(order, order[1:]):
            if strides[outer] % strides[inner] or strides[outer] // strides[inner] < sizes[inner]:
                return None  # overlapping, or not a box
            shape.append(strides[outer] // strides[inner])
        shape.append(strides[order[-1]] if order else 1)
        return _Box(sizes, tensor.storage_offset(), order, shape)

    @property
    def span(self) -> int:
        return math.prod(self.shape)

    @property
    def writable(self) -> bool:
        """Whether the view's elements are distinct (no broadcast dimension)."""
        return len(self.order) == sum(1 for n in self.sizes if n != 1)

    def _padded(self, flat: torch.Tensor) -> torch.Tensor:
        """The storage, with zeros after it where the box runs past its end."""
        end = self.offset + self.span
        return torch.nn.functional.pad(flat, (0, end - flat.numel())) if end > flat.numel() else flat

    def _region(self, padded: torch.Tensor) -> torch.Tensor:
        return padded[self.offset:self.offset + self.span].view(self.shape)

    def _corner(self) -> list:
        return [self.sizes[d] for d in self.order]

    def read(self, flat: torch.Tensor) -> torch.Tensor:
        corner = self._region(self._padded(flat))
        for k, n in enumerate(self._corner()):
            corner = corner.narrow(k, 0, n)
        corner = corner.select(-1, 0) if self.order else corner.reshape([])
        # From decreasing stride back to the view's order, its other dimensions restored.
        kept = sorted(self.order)
        corner = corner.permute([self.order.index(d) for d in kept])
        return corner.reshape([n if d in kept else 1 for d, n in enumerate(self.sizes)]).expand(self.sizes)

    def write(self, flat: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """`flat` with `value` (of the view's sizes) written where the view lies."""
        corner = value.reshape([n for n in self.sizes if n != 1] or [1])
        kept = sorted(self.order)
        corner = corner.permute([kept.index(d) for d in self.order]) if self.order else corner
        corner = corner.unsqueeze(-1) if self.order else corner.reshape(self.shape[:1] + [1])
        padded = self._padded(flat)
        new_region = _put(self._region(padded), corner, 0)
        new = torch.slice_scatter(padded, new_region.reshape(-1), 0, self.offset, self.offset + self.span)
        return new[:flat.numel()] if padded is not flat else new


def _put(region: torch.Tensor, corner: torch.Tensor, dim: int) -> torch.Tensor:
    """`region` with `corner` written at its leading corner from dimension `dim` on."""
    if dim == region.dim():
        return corner
    n = corner.shape[dim]
    inner = _put(region.narrow(dim, 0, n), corner, dim + 1)
    return inner if n == region.shape[dim] else torch.slice_scatter(region, inner, dim, 0, n)


class _Signature:
    """An op's tensor arguments as its program takes them: one input per storage of the device
    (by the first tensor lying in it) and one per host tensor, in argument order. A storage
    never written is no input: its zeros are made inside the program (an `out=` tensor torch
    has just made costs no upload, and XLA drops zeros the op overwrites)."""

    def __init__(self, flat: list, numbers: set):
        # Numbers made tensors (`bind`) are constants of the program, not inputs.
        self.positions = [i for i, v in enumerate(flat) if isinstance(v, torch.Tensor) and id(v) not in numbers]
        self.layouts: dict[int, _Layout] = {}  # by flat position, for device tensors
        self.inputs: list[tuple[str, int]] = []  # ("tensor", device ordinal) | ("host", host ordinal)
        self.examples: list[torch.Tensor] = []
        # What the trace reads, storage by storage and host tensor by host tensor: the program's
        # input of that number, or zeros (dims, dtype).
        self.values: list[int | tuple[list, torch.dtype]] = []
        self.ordinal: dict[int, int] = {}  # flat position -> device ordinal
        self.host_inputs: dict[int, int] = {}  # flat position -> its place in `values`, for host tensors
        storages: dict[int, _Layout] = {}
        devices = hosts = 0
        for i in self.positions:
            tensor = flat[i]
            if on_device(tensor):
                self.ordinal[i] = devices
                address = tensor.untyped_storage().data_ptr() or id(tensor)
                found = storages.get(address)
                if found is None:
                    found = storages[address] = _Layout(tensor, len(self.values))
                    if found.unwritten:
                        self.values.append((found.dims, found.dtype))
                    else:
                        self._input(("tensor", devices), torch.empty(found.dims, dtype=found.dtype))
                    self.layouts[i] = found
                else:  # another tensor in a storage already an input
                    self.layouts[i] = _Layout(tensor, found.input, storage=found)
                devices += 1
            else:
                self.host_inputs[i] = len(self.values)
                self._input(("host", hosts), torch.empty(tensor.shape, dtype=tensor.dtype))
                hosts += 1

    def _input(self, kind: tuple[str, int], example: torch.Tensor) -> None:
        self.values.append(len(self.inputs))
        self.inputs.append(kind)
        self.examples.append(example)

    def read(self, inputs) -> list[torch.Tensor]:
        """The values the trace reads (`values`), from the program's inputs."""
        return [inputs[v] if isinstance(v, int) else torch.zeros(v[0], dtype=v[1]) for v in self.values]


def _trace_storages(func, flat: list, spec, signature: _Signature, out: dict, call=None):
    """`func` (computed by `call` when given: a stand-in of the same arguments) on arguments like
    `flat`, traced over the storages of `signature`: the graph's outputs are the new values of
    the storages it writes, then what it returns of its own. `out` receives what the planner
    needs to know of them."""
    schema = op_tracing.schema(func)
    written_ids = {id(t) for t in schema.written_tensors(*tree_unflatten(flat, spec))}

    def functional(*program_inputs):
        inputs = signature.read(program_inputs)
        values = list(flat)
        for i in signature.positions:
            tensor = flat[i]
            layout = signature.layouts.get(i)
            if layout is not None:
                value = _read(inputs[layout.input], tensor, layout)
            else:
                value = inputs[signature.host_inputs[i]]
            # What the op writes, it writes into copies: the program computes their new values.
            values[i] = value.clone() if id(tensor) in written_ids else value
        call_args, call_kwargs = tree_unflatten(values, spec)
        result = (call or func)(*call_args, **call_kwargs)
        new_values = schema.written_tensors(call_args, call_kwargs)
        originals = schema.written_tensors(*tree_unflatten(flat, spec))
        # Storages written, in order, each taking its writes one after the other.
        storages: dict[int, torch.Tensor] = {}
        writes = []  # (flat position, storage input, resized sizes or None)
        for original, value in zip(originals, new_values):
            position = next(i for i in signature.positions if flat[i] is original)
            layout = signature.layouts[position]
            if list(value.shape) != list(original.shape):  # an out= of another size: resized
                storages[layout.input] = value.contiguous()
                writes.append((position, layout.input, list(value.shape)))
                continue
            current = storages.get(layout.input, inputs[layout.input])
            storages[layout.input] = _written(current, value, original, layout)
            if all(w[1] != layout.input for w in writes):
                writes.append((position, layout.input, None))
        fresh = [r for r in tree_flatten(result)[0]
                 if not (isinstance(r, torch.Tensor) and any(r is w for w in new_values))]
        out["writes"] = writes
        out["fresh"] = [op_tracing.TENSOR if isinstance(r, torch.Tensor) else r for r in fresh]
        return (*(storages[w[1]] for w in writes), *(r for r in fresh if isinstance(r, torch.Tensor)))

    from torch.fx.experimental.proxy_tensor import make_fx

    from .compiler import decompositions
    compiler = op_tracing.compiler()
    # Functionalized when it writes: the device's ops arrive below autograd as in-place and out=
    # variants (structured kernels), which the graph takes as their functional forms.
    traced = torch.func.functionalize(functional, remove="mutations_and_views") if written_ids else functional
    gm = make_fx(traced, decomposition_table={**decompositions(compiler.opts), **_scalar_operands()},
                 tracing_mode="fake", _allow_non_fake_inputs=True)(*signature.examples)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


@functools.cache
def _stand_ins() -> dict:
    """Ops traced as another of the same arguments and results: convolutions reach a device
    other than the CPU's and CUDA's as `convolution_overrideable`, which only such a device
    implements, some composite ops as helpers of the CPU's, and batch norm with its running
    statistics' update made explicit."""
    aten = torch.ops.aten

    def convolution_backward(grad_output, input, weight, stride, padding, dilation, transposed, output_padding,
                             groups, output_mask):
        channels = weight.shape[1] * groups if transposed else weight.shape[0]
        return aten.convolution_backward.default(grad_output, input, weight, [channels], stride, padding, dilation,
                                                 transposed, output_padding, groups, output_mask)

    def running(op):
        # `_cummax_helper(self, values, indices, dim)`: the op's results written into its outputs.
        def helper(self, values, indices, dim):
            found = op(self, dim)
            values.copy_(found[0])
            indices.copy_(found[1])
        return helper

    def batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
        # Its schema hides that training updates the running statistics in place: traced as the
        # functional form and explicit copies, so that a fused run's graph keeps the update.
        if not training or running_mean is None or running_var is None:
            return aten.native_batch_norm.default(input, weight, bias, running_mean, running_var, training,
                                                  momentum, eps)
        out, mean, rstd, new_mean, new_var = aten._native_batch_norm_legit_functional.default(
            input, weight, bias, running_mean, running_var, training, momentum, eps)
        running_mean.copy_(new_mean)
        running_var.copy_(new_var)
        return out, mean, rstd

    def random_in_range(self, low, high=None, generator=None):
        # `random_.from` functionalized is `random.from`, which FX cannot print (`from` is a
        # Python keyword): drawn as tpuc's randint draws (docs/random.md), from a 53-bit uniform.
        # Without `to`, torch's upper end: the largest integer the dtype holds exactly.
        if high is None:
            high = (2 ** (torch.finfo(self.dtype).nmant + 1) if self.dtype.is_floating_point
                    else torch.iinfo(self.dtype).max)
        u = torch.rand(self.shape, dtype=torch.float64, device=self.device)
        return self.copy_((low + torch.floor(u * (high - low))).to(self.dtype))

    # Helpers a device other than the CPU's and CUDA's reaches inside composite ops (cummax,
    # logcumsumexp), traced as the ops they implement, which tpuc lowers.
    return {**{getattr(op, overload): fused_adam(decoupled)
               for op, decoupled in ((aten._fused_adam_, False), (aten._fused_adamw_, True))
               for overload in ("default", "tensor_lr")},
            getattr(aten.random_, "from"): random_in_range,
            aten.convolution_overrideable.default: aten.convolution.default,
            aten.native_batch_norm.default: batch_norm,
            # cholesky_solve's helper takes the operands it broadcast, which the op takes as well.
            aten._cholesky_solve_helper.default: aten.cholesky_solve.default,
            aten.convolution_backward_overrideable.default: convolution_backward,
            aten._cummax_helper.default: running(aten.cummax.default),
            aten._cummin_helper.default: running(aten.cummin.default),
            aten._logcumsumexp.default: aten.logcumsumexp.default}


def fused_adam(decoupled: bool):
    """`torch.optim.Adam(W)(fused=True)`'s step (`_fused_adam(w)_`: every parameter in one op) as
    the fused kernels compute it: in float32 for lower precisions; gradients unscaled by
    `grad_scale` (and written back unscaled); nothing changed where `found_inf` is set. torch's
    functionalization of the op itself fails, so it is traced as these writes.

    Every hyperparameter is a tensor operand of an op, never folded into a Python number (`1 -
    beta1`) nor an op's number argument (`pow(beta1, step)`): so one program, with them as its
    inputs (`op_tracing.lifted`), serves every value, and a learning-rate schedule does not
    make a program per step."""
    def step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
             weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
        maxima = max_exp_avg_sqs if amsgrad else [None] * len(params)
        for param, grad, exp_avg, exp_avg_sq, maximum, count in zip(params, grads, exp_avgs, exp_avg_sqs, maxima,
                                                                     state_steps):
            p, g, m, v = (t.float() for t in (param, grad, exp_avg, exp_avg_sq))
            count = count.float()
            one = torch.ones_like(count)
            beta1_, beta2_ = one * beta1, one * beta2
            if grad_scale is not None:
                g = g / grad_scale
            unscaled = g
            if maximize:
                g = -g
            if weight_decay != 0:
                if decoupled:
                    p = p - p * lr * weight_decay
                else:
                    g = g + p * weight_decay
            m = m * beta1_ + g * (one - beta1_)
            v = v * beta2_ + g * g * (one - beta2_)
            step_size = (one - torch.pow(beta1_, count)).reciprocal() * lr
            root_correction = torch.sqrt(one - torch.pow(beta2_, count))
            if maximum is not None:
                highest = torch.maximum(maximum.float(), v)
                denominator = torch.sqrt(highest) / root_correction + eps
            else:
                denominator = torch.sqrt(v) / root_correction + eps
            p = p - step_size * m / denominator
            writes = [(param, p), (exp_avg, m), (exp_avg_sq, v)]
            if maximum is not None:
                writes.append((maximum, highest))
            if grad_scale is not None:
                writes.append((grad, unscaled))
            for target, value in writes:
                if found_inf is not None:
                    value = torch.where(found_inf != 0, target.float(), value)
                target.copy_(value)
    step.floats_are_operands = True
    return step


def _padded(func, args, kwargs):
    """For an op whose result's size depends on its values (nonzero, masked_select, indexing by
    a boolean mask, unique, unique_consecutive), a function of its arguments computing its
    results padded to their largest size and then the count they are cut to, and for each
    result the dimension it is cut along (None: not cut); None for any other op."""
    aten = torch.ops.aten
    if func is aten.nonzero.default:
        def nonzero(x):
            return torch.nonzero_static(x, size=x.numel()), (x != 0).sum()
        return nonzero, [0]
    if func is aten.masked_select.default:
        def masked_select(x, mask):
            x, mask = torch.broadcast_tensors(x, mask)
            flat = mask.reshape(-1)
            where = torch.nonzero_static(flat, size=flat.numel())[:, 0]
            return x.reshape(-1)[where], flat.sum()
        return masked_select, [0]
    if func is aten.index.Tensor:
        indices = args[1]
        mask = indices[0] if indices else None
        if (isinstance(mask, torch.Tensor) and mask.dtype in (torch.bool, torch.uint8)
                and all(i is None for i in indices[1:])):
            def index_by_mask(x, indices):
                mask = indices[0].bool()
                found = torch.nonzero_static(mask, size=mask.numel())
                return x[tuple(found[:, d] for d in range(mask.dim()))], mask.sum()
            return index_by_mask, [0]
    if func is aten._unique2.default:
        counts = 0 if _argument(args, kwargs, 3, "return_counts", False) else None
        return _unique, [0, None, counts]
    if func is aten.unique_consecutive.default and _argument(args, kwargs, 3, "dim", None) is None:
        counts = 0 if _argument(args, kwargs, 2, "return_counts", False) else None
        return _unique_consecutive, [0, None, counts]
    if func in (aten.unique_dim.default, aten.unique_consecutive.default):
        x = args[0]
        dim = _argument(args, kwargs, 1 if func is aten.unique_dim.default else 3, "dim", None)
        dim = dim % max(x.dim(), 1)
        # Empty inputs (torch refuses some) are left to the host.
        if x.numel() == 0:
            return None
        sort = func is aten.unique_dim.default

        def unique_along(x, *_flags, **_named):
            return _unique_slices(x, dim, sort)
        return unique_along, [dim, None, 0]
    return None


def _argument(args, kwargs, position: int, name: str, default):
    return args[position] if len(args) > position else kwargs.get(name, default)


def _unique(x, sorted=True, return_inverse=False, return_counts=False):  # noqa: A002 - the op's names
    """`_unique2` padded to the input's size: the runs of the sorted values."""
    values, order = torch.sort(x.reshape(-1), stable=True)
    return _runs(values, order, x.shape, return_inverse, return_counts)


def _unique_consecutive(x, return_inverse=False, return_counts=False, dim=None):
    """`unique_consecutive` of the whole input padded to its size: the runs of its elements."""
    return _runs(x.reshape(-1), None, x.shape, return_inverse, return_counts)


def _unique_slices(x, dim: int, sort: bool):
    """`unique_dim` (`sort`) or `unique_consecutive` along `dim`, padded to the input's size:
    the distinct slices (in order), each slice's run, the runs' lengths, then the number of runs.
    Slices compare as rows of their elements; sorted lexicographically by one stable sort per
    element, the last first."""
    n = x.shape[dim]
    rows = x.movedim(dim, 0).reshape(n, -1)
    order = torch.arange(n)
    if sort:
        for column in reversed(range(rows.shape[1])):
            order = order[torch.sort(rows[order, column], stable=True)[1]]
        rows = rows[order]
    first = torch.cat([torch.ones(1, dtype=torch.bool), (rows[1:] != rows[:-1]).any(dim=1)])
    run = torch.cumsum(first.to(torch.int64), 0) - 1
    distinct = torch.zeros_like(rows).index_put((run,), rows)
    inverse = torch.zeros(n, dtype=torch.int64).index_put((order,), run) if sort else run
    counts = torch.zeros(n, dtype=torch.int64).index_add(0, run, torch.ones(n, dtype=torch.int64))
    shape = [n] + [s for d, s in enumerate(x.shape) if d != dim]
    return distinct.reshape(shape).movedim(0, dim), inverse, counts, first.sum()


def _runs(values, order, shape, return_inverse: bool, return_counts: bool):
    """The runs of equal elements of the flat `values`, padded to its size: each run's value (its
    first element's), each element's run (the inverse index, at the place `order` took the element
    from, where given, in the input's `shape`), the runs' lengths, then the number of runs."""
    n = values.numel()
    first = torch.cat([torch.ones(min(n, 1), dtype=torch.bool), values[1:] != values[:-1]])
    run = torch.cumsum(first.to(torch.int64), 0) - 1
    distinct = torch.zeros(n, dtype=values.dtype).scatter(0, run, values)
    if return_inverse:
        inverse = (run if order is None else torch.zeros(n, dtype=torch.int64).scatter(0, order, run)).reshape(shape)
    else:
        inverse = torch.zeros(0, dtype=torch.int64)
    counts = (torch.zeros(n, dtype=torch.int64).scatter_add(0, run, torch.ones(n, dtype=torch.int64))
              if return_counts else torch.zeros(0, dtype=torch.int64))
    return distinct, inverse, counts, first.sum()


@functools.cache
def _scalar_operands() -> dict:
    """Decompositions of ops whose Scalar argument changes from call to call (an optimizer's
    step size in `addcdiv`): decomposed, the number is an operand of a multiplication, which
    `op_tracing.lifted` makes an input, so one program serves every value."""
    aten = torch.ops.aten
    return torch._decomp.get_decompositions([aten.addcdiv, aten.addcmul, aten.lerp])


def plan(name: str, overload: str, arguments: list, types: bytes = b"", values: bytes = b""):
    """The plan of op `name.overload` for arguments like these (the boxed arguments, every one
    in the schema's order), whose native key is `types` and `values` (the floats')."""
    func = op_of(name, overload)
    started = time.perf_counter()
    STATS["plans"] += 1
    try:
        device = torch.tpuc.current_device()
        stored = _StoredPlans(name, overload, types, values, device)
        revived = stored.revive()
        if revived is not None:
            STATS["plans_from_disk"] += 1
            return revived
        # The planner's tracing is its own: what is active where the op was called (an
        # aot_autograd runtime wrapper's dispatch mode, functionalization, grad modes) is not its
        # business, so it traces on a thread of its own, whose thread-local state is fresh.
        with _disable_current_modes():
            args, kwargs, numbers = bind(func, arguments)
        plan_, fallback = on_planning_thread(_plan, func, args, kwargs, numbers, device, stored)
        if fallback is not None:  # said here, where the user's line is on the stack
            op_tracing.falls_back(func, *fallback)
        return plan_
    finally:
        STATS["plan_seconds"] += time.perf_counter() - started


@functools.cache
def _planning_thread() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpuc-planner")


def on_planning_thread(function, *args):
    """`function(*args)` run on the planner's own thread (fresh thread-local state: no dispatch
    mode, functionalization or grad mode of the caller's), its result or its error."""
    return _planning_thread().submit(function, *args).result()


@functools.cache
def _host_checks() -> frozenset:
    """Ops that exist to read a value back and raise on it (linear algebra's `info` codes, an
    asserted condition): they run on the host as on any eager accelerator, which synchronises
    for them too, without a warning and in strict mode as well."""
    aten = torch.ops.aten
    return frozenset({aten._linalg_check_errors.default, aten._assert_async.default, aten._assert_async.msg})


def _plan(func, args: list, kwargs: dict, numbers: set, device: int, stored: "_StoredPlans | None" = None):
    """(the plan, None) or, for an op run on the host that reads the device's tensors, (the plan,
    (why it cannot run on the device, the error saying so)); a program's plan is given to
    `stored` to keep."""
    if func.is_view:
        return _view_plan(func, args, kwargs), None
    if func in _host_checks():
        return ("host",), None
    flat, spec = tree_flatten((args, kwargs))
    signature = _Signature(flat, numbers)
    try:
        padded = _padded(func, args, kwargs)
        if padded is not None:
            call, counted = padded
            return _program_plan(func, flat, spec, signature, device, call=call, counted=counted,
                                 stored=stored), None
        return _program_plan(func, flat, spec, signature, device, call=_stand_ins().get(func), stored=stored), None
    except Exception as error:  # noqa: BLE001 - only what `_cannot_run` recognises is handled
        reason = op_tracing.cannot_run(error)
        if reason is None:
            raise
        if signature.layouts and any(not _written_only(func, flat, spec, i) for i in signature.layouts):
            return ("host",), (reason, error)
        return ("host",), None


def _written_only(func, flat, spec, position: int) -> bool:
    """Whether the device tensor at flat `position` is only written by the op (a factory's out=)."""
    schema = op_tracing.schema(func)
    bound = schema.bind(*tree_unflatten(flat, spec))
    return any(bound.get(name) is flat[position] for name in schema.outs)


def _program_plan(func, flat, spec, signature: _Signature, device: int, call=None, counted: list | None = None,
                  stored: "_StoredPlans | None" = None):
    """The plan of a program computing `func` (by `call` when given); `counted`: `call` returns
    the op's results padded to their largest size, then the count they are cut to along the
    dimension given here for each (`_padded`); `stored` keeps it on disk."""
    out: dict = {}

    def trace(f, values, value_spec):
        return _trace_storages(f, values, value_spec, signature, out, call=call)

    lifted = op_tracing.lifted(func, flat, spec, trace=trace, operands=getattr(call, "floats_are_operands", False))
    floats = [v for v in flat if type(v) is float]
    if lifted is not None:
        gm, float_dtype = lifted
    else:
        gm, float_dtype = trace(func, flat, spec), None
    # The entry is the call's device's (its key holds the device): its constants live there.
    device = next((flat[i].device.index or 0 for i in signature.layouts), device)
    name = f"eager_{func.__name__.replace('.', '_')}"
    program, prepared, output_types = compile_graph(gm, name, device)
    inputs = [(kind, index, None) for kind, index in signature.inputs]
    if lifted is not None:
        inputs += [("float", k, float_dtype) for k in range(len(floats))]

    def output_type(k: int):
        kind, what = prepared.outputs[k]
        if kind == "tensor":
            return output_types[what]
        example = (signature.examples + list(prepared.constants))[what]
        return example.dtype, list(example.shape)

    writes = []
    for k, (position, _input, resized) in enumerate(out["writes"]):
        dtype, dims = output_type(k)
        writes.append((signature.ordinal[position], k, list(dims), dtype, resized))
    count_output = None
    if counted is not None:
        returns = []
        for k, cut in enumerate(counted):
            dtype, sizes = output_type(len(writes) + k)
            returns.append(("new", len(writes) + k, dtype, list(sizes), cut))
        count_output = len(writes) + len(counted)
    else:
        returns = _returns(func, flat, spec, signature, out, len(writes), output_type)
    _GRAPHS.append(gm)
    if stored is not None:
        stored.keep(len(_GRAPHS) - 1, lifted is not None, {
            **program_record(name, device, prepared), "inputs": inputs, "writes": writes, "returns": returns,
            "lifted": lifted is not None, "count_output": count_output, "graph": plan_store.StoredGraph.of(gm)})
    return ("program", program, inputs, writes, returns, lifted is not None, count_output, len(_GRAPHS) - 1)


# The graphs of the ops planned, by number (an entry's `graph`): fused mode joins them. A plan
# revived from disk has its graph revived when fused mode first asks for it.
_GRAPHS: list["torch.fx.GraphModule | plan_store.StoredGraph"] = []


class _StoredPlans:
    """The plans on disk of one op's native key (`plan_store`): one serving every value of its
    floats (lifted), else one for these values."""

    def __init__(self, name: str, overload: str, types: bytes, values: bytes, device: int):
        compiler = op_tracing.compiler()
        # Dumps are of what the planner traces: a process asked for them plans every op. A JAX
        # kernel's op is planned in every process: its function is the process's own.
        self.on = (bool(types) and not compiler.opts.dump_dir and plan_store.directory() is not None
                   and not kernels.registered(str(op_of(name, overload))))
        if not self.on:
            return
        settings = f"{compiler.opts!r} {torch.get_default_dtype()} {torch.are_deterministic_algorithms_enabled()} " \
                   f"{session(None).runtime.platform} current device {device}"
        self.lifted = plan_store.key(name, overload, types, b"", settings)
        self.exact = plan_store.key(name, overload, types, values, settings) if values else self.lifted

    def revive(self):
        """The stored plan, its program loaded and its constants uploaded; None if none."""
        if not self.on:
            return None
        for name in dict.fromkeys((self.lifted, self.exact)):
            record = plan_store.load(name)
            if record is not None:
                return self._revived(record)
        return None

    def keep(self, graph: int, lifted: bool, record: dict) -> None:
        """Stores the plan of graph number `graph`."""
        if self.on:
            name = self.lifted if lifted else self.exact
            if plan_store.store(name, record):
                _STORED_AS[graph] = name

    def _revived(self, record: dict):
        program = load_stored_program(record)
        _GRAPHS.append(record["graph"])
        _STORED_AS[len(_GRAPHS) - 1] = self.lifted if record["lifted"] else self.exact
        return ("program", program, record["inputs"], record["writes"], record["returns"], record["lifted"],
                record["count_output"], len(_GRAPHS) - 1)


# The names in `plan_store` of the plans of graphs, by number: fused mode keeps the programs of
# runs of such ops under their names.
_STORED_AS: dict[int, str] = {}


def stored_as(graph: int) -> str | None:
    """The name of graph number `graph`'s plan in `plan_store`, None when not stored."""
    return _STORED_AS.get(graph)


def program_record(name: str, device: int, prepared) -> dict:
    """What `load_stored_program` revives a program of a prepared graph from."""
    return {"name": name, "device": device, "program": prepared.program, "outputs": prepared.outputs,
            "constants": [c.detach().cpu().contiguous() for c in prepared.constants]}


def load_stored_program(record: dict):
    """The native layer's `Compiled` of a `program_record`."""
    return load_program(record["program"], record["name"], record["constants"], record["outputs"],
                        record["device"])[0]


def _dump(directory: str, name: str, gm: torch.fx.GraphModule, compiled) -> None:
    """The dump directory's files of a program the device compiled (as the backend writes them,
    numbered: an op compiles once per key), and the device's cache statistics."""
    import json

    from .compiler import dump_graph

    number = STATS["plans"] + STATS["fused_runs_planned"]
    dump_graph(directory, f"{name}_{number}", gm, compiled)
    with open(os.path.join(directory, "device_cache_stats.json"), "w") as out:
        json.dump({**_tpuc_native.cache_stats(), **STATS}, out, indent=1)


def graph_of(number: int) -> torch.fx.GraphModule:
    """The graph of the op planned with number `number` (its inputs: the program's, less its
    constants; its outputs: the written storages' new values, then what the op returns)."""
    graph = _GRAPHS[number]
    if isinstance(graph, plan_store.StoredGraph):
        graph = _GRAPHS[number] = graph.graph()
    return graph


def compile_graph(gm: torch.fx.GraphModule, name: str, device: int):
    """`gm` compiled for the device's ordinal `device`: the native layer's `Compiled`
    (module.cpp `parse_compiled`: program, constants on the device, where each graph output
    comes from, the number of results, whether it takes a seed), the prepared graph and each
    result's (dtype, shape)."""
    from .graph import unsupported_ops
    compiler = op_tracing.compiler()
    missing = unsupported_ops(gm, compiler.supported)
    if missing:
        raise _tpuc.UnsupportedOpsError(f"tpuc does not lower {', '.join(sorted(missing))}")
    prepared = compiler.prepare(gm, name)
    if any(kind not in ("tensor", "arg") for kind, _ in prepared.outputs):
        raise _tpuc.TpucError(f"{name}: a graph output of kind {prepared.outputs}")
    program, output_types = load_program(prepared.program, name, prepared.constants, prepared.outputs, device,
                                         dumped=prepared.gm)
    return program, prepared, output_types


def load_program(program: bytes, name: str, constants: list, outputs: list, device: int, dumped=None):
    """The native layer's `Compiled` of a prepared graph's `program` (its executable from the
    compile cache, or compiled), its `constants` uploaded to device `device` and its `outputs`
    (`PreparedGraph.outputs`) said as the native layer takes them; and each result's (dtype,
    shape). `dumped`: the graph to write to the dump directory, when one is set."""
    compiler = op_tracing.compiler()
    compiled = session(None).compile(program, name, compiler.opts.compile)
    if compiled.cache == "hit":
        STATS["loaded_from_disk"] += 1
    if compiler.opts.dump_dir and dumped is not None:
        _dump(compiler.opts.dump_dir, name, dumped, compiled)
    runtime = session(None).runtime
    values = []
    for constant in constants:
        host = constant.detach().contiguous()
        buffer = runtime.buffer(host.data_ptr(), host.numel() * host.element_size(), dtype_name(host.dtype),
                                list(host.shape), host.untyped_storage(), device=device)
        values.append(buffer.native_value())
    sources = [("result", what) if kind == "tensor" else ("input", what) for kind, what in outputs]
    native = (compiled.native_program(), values, sources, len(compiled.output_specs), compiled.random)
    return native, [(getattr(torch, dtype_text), shape) for dtype_text, shape in compiled.output_specs]


def _returns(func, flat, spec, signature: _Signature, out: dict, first_fresh: int, output_type) -> list:
    """What the op returns, in its schema's order: a written argument itself (in-place ops,
    `out=`), a new tensor of the graph's next output, a list of them, or a value."""
    schema = func._schema
    arguments = op_tracing.schema(func).bind(*tree_unflatten(flat, spec))
    fresh = iter(out["fresh"])
    next_output = [first_fresh]

    def new():
        dtype, sizes = output_type(next_output[0])
        spec_ = ("new", next_output[0], dtype, list(sizes))
        next_output[0] += 1
        return spec_

    def ordinal_of(tensor) -> int:
        return next(signature.ordinal[i] for i in signature.positions if flat[i] is tensor)

    returns = []
    for schema_return in schema.returns:
        alias = schema_return.alias_info
        written = None
        if alias is not None and alias.is_write:
            written = next((arguments[a.name] for a in schema.arguments
                            if a.alias_info is not None and a.alias_info.before_set == alias.before_set), None)
        if isinstance(written, torch.Tensor):
            returns.append(("arg", ordinal_of(written)))
        elif isinstance(written, (list, tuple)):
            returns.append(("list", [("arg", ordinal_of(t)) for t in written]))
        elif isinstance(schema_return.type, torch.ListType):  # the rest of the results
            items = []
            for value in fresh:
                if value is not op_tracing.TENSOR:
                    raise _tpuc.TpucError(f"{func}: a list result holding a {type(value).__name__}")
                items.append(new())
            returns.append(("list", items))
        else:
            value = next(fresh)
            returns.append(new() if value is op_tracing.TENSOR else ("value", value))
    return returns


def _view_plan(func, args, kwargs):
    """A view op without a kernel of its own on the device: the views its meta kernel makes, of
    the storage of its (first) device tensor."""
    flat, spec = tree_flatten((args, kwargs))
    source = next(v for v in flat if on_device(v))
    ordinal = sum(1 for v in flat[:flat.index(source)] if on_device(v))
    meta_storage = torch.empty(source.untyped_storage().nbytes() // source.element_size(), dtype=source.dtype,
                               device="meta")

    def meta(value):
        if on_device(value):
            if value.untyped_storage().data_ptr() != source.untyped_storage().data_ptr():
                raise _tpuc.TpucError(f"{func}: a view of two tensors of the device")
            return meta_storage.as_strided(value.shape, value.stride(), value.storage_offset())
        return value

    result = func(*tree_map(meta, args), **tree_map(meta, kwargs))

    def layout(view):
        return ("view", ordinal, list(view.shape), list(view.stride()), view.storage_offset(), view.dtype)

    if isinstance(result, torch.Tensor):
        return ("view", [layout(result)])
    return ("view", [("list", [layout(v) for v in result])])


def run_on_host(name: str, overload: str, arguments: list):
    """Op `name.overload` run by torch on the host: the device's tensors copied there, what it
    writes and returns copied back."""
    func = op_of(name, overload)
    STATS["host_ops"] += 1
    args, kwargs, _ = bind(func, arguments)
    with _disable_current_modes():
        cpu_args, cpu_kwargs = tree_map(to_host, (args, kwargs))
        result = func(*cpu_args, **cpu_kwargs)
    schema = op_tracing.schema(func)
    written = list(zip(schema.written_tensors(args, kwargs), schema.written_tensors(cpu_args, cpu_kwargs)))
    for target, value in written:
        if target.shape != value.shape:
            target.resize_(value.shape)
        target.copy_(value)
    if written and not func._schema.returns:
        return None
    device = next((v.device for v in tree_flatten((args, kwargs))[0] if on_device(v)), torch.device(NAME))

    def back(value):
        # What it writes it returns as the device's tensor itself.
        target = next((t for t, cpu_value in written if value is cpu_value), None)
        if target is not None:
            return target
        return value.to(device) if isinstance(value, torch.Tensor) else value

    return tree_map(back, result)
