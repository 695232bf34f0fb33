"""Conversion of folded ONNX nodes to the float IR vocabulary of :mod:`hwonnx.ir.graph`; one
function per ONNX operator, all registered in ``CONVERTERS``."""

import math
from dataclasses import replace
from typing import Callable

import numpy as np
import onnx

from ..errors import HwonnxError, ModelError, UnsupportedOperatorError
from ..golden.im2col import windows_touch_input
from ..ir.evaluate import check_node_work
from ..ir.graph import Graph, Node
from ..ir.ops import IR_OPS
from ..ir.tables import TABLE_OPS
from ..passes.channel_shuffle import channel_order
from ..passes.rewrite import channel_scale_node, channel_weight
from .builder import (NO_ACTIVATION, GraphBuilder, check_per_channel, check_windows,
                      explicit_pads, input_4d, node_attrs, unsupported)
from .common import summary
from .eltwise import convert_eltwise, convert_prelu
from .slicing import SLICING_CONVERTERS, pad_by_copies
from .upsample import UPSAMPLE_CONVERTERS

__all__ = ["CONVERTERS", "convert_graph", "convert_softmax"]


def _conv(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    x, shape = input_4d(b, node, "convolution")
    attrs = node_attrs(node)
    weight = b.onnx_constants[node.input[1]]
    kernel = tuple(attrs.get("kernel_shape", weight.shape[2:]))
    if kernel != tuple(weight.shape[2:]):
        raise ModelError(f"Conv '{node.name}' has kernel_shape {list(kernel)}, but its weight "
                         f"has shape {list(weight.shape)}")
    group = int(attrs.get("group", 1))
    if group < 1 or shape[1] % group or weight.shape[0] % group \
            or weight.shape[1] * group != shape[1]:
        raise ModelError(f"Conv '{node.name}' has group={group}, which does not fit its input "
                         f"of {shape[1]} channels and its weight of shape {list(weight.shape)} "
                         f"(it needs input channels = group x weight.shape[1] and output "
                         f"channels divisible by group)")
    strides = tuple(attrs.get("strides", (1, 1)))
    dilations = tuple(attrs.get("dilations", (1, 1)))
    pads = explicit_pads(node, attrs, shape[2:], kernel, strides, dilations)
    check_windows(b, node, shape, kernel, strides, pads, dilations)
    inputs = [x, b.constant(node, node.input[1])]
    if len(node.input) > 2 and node.input[2]:
        check_per_channel(b, node, 2, "bias", weight.shape[0], "output channel")
        inputs.append(b.constant(node, node.input[2]))
    return Node(node.name, "Conv", inputs, (b.value(node.output[0]),),
                {"strides": strides, "pads": pads, "dilations": dilations, "group": group,
                 **NO_ACTIVATION})


def _average_pool(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    x, shape = input_4d(b, node, "pooling")
    attrs = node_attrs(node)
    if attrs.get("ceil_mode", 0):
        raise ModelError(f"AveragePool '{node.name}' has ceil_mode=1; only ceil_mode=0 (output "
                         f"size rounded down) is supported")
    kernel = tuple(attrs["kernel_shape"])
    dilations = tuple(attrs.get("dilations", (1, 1)))
    if dilations != (1, 1):
        raise ModelError(f"AveragePool '{node.name}' has dilations {list(dilations)}; only "
                         f"dilations [1, 1] are supported")
    strides = tuple(attrs.get("strides", (1, 1)))
    pads = explicit_pads(node, attrs, shape[2:], kernel, strides, dilations)
    if any(p >= k for p, k in zip(pads, kernel * 2)):
        raise ModelError(f"AveragePool '{node.name}' has pads {list(pads)}; each must be "
                         f"smaller than the kernel {list(kernel)} (a window must not lie "
                         f"entirely in the padding)")
    check_windows(b, node, shape, kernel, strides, pads, dilations)
    return Node(node.name, "AvgPool", (x,), (b.value(node.output[0]),),
                {"kernel": kernel, "strides": strides, "pads": pads,
                 "count_include_pad": bool(attrs.get("count_include_pad", 0)), **NO_ACTIVATION})


def _max_pool(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    x, shape = input_4d(b, node, "pooling")
    attrs = node_attrs(node)
    if len(node.output) > 1 and node.output[1]:
        raise unsupported(b, node, (
            f"MaxPool '{node.name}' has an Indices output '{node.output[1]}'; only the pooled "
            f"values have a hardware mapping"))
    kernel = tuple(attrs["kernel_shape"])
    dilations = tuple(attrs.get("dilations", (1, 1)))
    strides = tuple(attrs.get("strides", (1, 1)))
    pads = explicit_pads(node, attrs, shape[2:], kernel, strides, dilations)
    if attrs.get("ceil_mode", 0):
        pads = _ceil_pads(node, shape[2:], kernel, strides, pads, dilations)
    check_windows(b, node, shape, kernel, strides, pads, dilations)
    if not all(windows_touch_input(size, k, s, begin, end, d) for size, k, s, begin, end, d
               in zip(shape[2:], kernel, strides, pads[:2], pads[2:], dilations)):
        raise ModelError(f"MaxPool '{node.name}' has pads {list(pads)}; with kernel "
                         f"{list(kernel)} and dilations {list(dilations)} a window would lie "
                         f"entirely in the padding of its {list(shape[2:])} input")
    return Node(node.name, "MaxPool", (x,), (b.value(node.output[0]),),
                {"kernel": kernel, "strides": strides, "pads": pads, "dilations": dilations,
                 **NO_ACTIVATION})


def _ceil_pads(node: onnx.NodeProto, size, kernel, strides, pads, dilations
               ) -> "tuple[int, int, int, int]":
    """A max pool's ``ceil_mode=1`` as more padding at the end (padding never wins a max):
    ONNX rounds the output size up, ``ceil((n + pads - span) / s) + 1``. Where that puts the
    last window's start in the end padding, onnxruntime and ONNX's reference implementation
    drop the window (as PyTorch does) but ONNX's shape inference keeps it: such a pool is
    refused, naming both sizes."""
    ends = []
    for axis, (n, k, s, begin, end, d) in enumerate(zip(size, kernel, strides, pads[:2],
                                                         pads[2:], dilations)):
        span = d * (k - 1) + 1
        out = -(-(n + begin + end - span) // s) + 1
        if (out - 1) * s >= n + begin:
            raise ModelError(
                f"MaxPool '{node.name}' has ceil_mode=1 and its last window along axis "
                f"{axis + 2} would start in the end padding: ONNX's shape inference gives "
                f"{out} outputs there, onnxruntime and ONNX's reference implementation "
                f"{out - 1}; give the pads that make the output size you mean with "
                f"ceil_mode=0")
        ends.append(end + max(0, (out - 1) * s + span - (n + begin + end)))
    return (*pads[:2], *ends)


def _global_max_pool(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    x, shape = input_4d(b, node, "pooling")
    return Node(node.name, "MaxPool", (x,), (b.value(node.output[0]),),
                {"kernel": tuple(shape[2:]), "strides": (1, 1), "pads": (0, 0, 0, 0),
                 "dilations": (1, 1), **NO_ACTIVATION})


def _global_average_pool(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    x, shape = input_4d(b, node, "pooling")
    return Node(node.name, "AvgPool", (x,), (b.value(node.output[0]),),
                {"kernel": tuple(shape[2:]), "strides": (1, 1), "pads": (0, 0, 0, 0),
                 "count_include_pad": True, **NO_ACTIVATION})


def _reduce_pool(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    """``ReduceMean`` or ``ReduceMax`` over height and width of a ``[N, C, H, W]`` value,
    dimensions kept (timm's squeeze-and-excitation blocks): the global pool it is."""
    x, shape = input_4d(b, node, "reduction over height and width")
    attrs = node_attrs(node)
    if len(node.input) > 1 and node.input[1]:             # opset 18: axes an input
        axes = [int(a) for a in np.asarray(b.onnx_constants[node.input[1]]).reshape(-1)]
    else:
        axes = [int(a) for a in attrs.get("axes", ())]
    if not axes and attrs.get("noop_with_empty_axes", 0):
        return _identity(b, node)
    if any(not -4 <= a < 4 for a in axes):
        raise ModelError(f"{node.op_type} '{node.name}' has axes {axes}, out of range for its "
                         f"rank-4 input (ONNX: each axis is in [-r, r-1])")
    reduced = sorted({a % 4 for a in axes}) if axes else [0, 1, 2, 3]
    if reduced != [2, 3]:
        raise unsupported(b, node, (
            f"{node.op_type} '{node.name}' reduces axes {reduced} of {list(shape)}; the array "
            f"reduces height and width (axes 2 and 3), a global pool"))
    pool = (_global_average_pool if node.op_type == "ReduceMean" else _global_max_pool)(b, node)
    if attrs.get("keepdims", 1):
        return pool
    # keepdims=0 (ShuffleNet's last ReduceMean): the pool, then a Reshape to [N, C]
    pooled = b.new_value(f"{pool.outputs[0]}:pooled", (shape[0], shape[1], 1, 1))
    out = pool.outputs[0]
    return [replace(pool, outputs=(pooled,)),
            Node(f"{node.name}:flatten", "Reshape", (pooled,), (out,),
                 {"shape": tuple(b.shape(out))})]


def _dense_input(b: GraphBuilder, node: onnx.NodeProto) -> str:
    x = b.value(node.input[0])
    if len(b.shape(x)) != 2 or b.shape(x)[0] != 1:
        raise ModelError(f"{node.op_type} '{node.name}' must read a [1, K] input, not "
                         f"{list(b.shape(x))}; it maps to Dense, which computes one row")
    return x


def _gemm(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    attrs = node_attrs(node)
    if attrs.get("transA", 0):
        raise ModelError(f"Gemm '{node.name}' must have transA=0, not transA=1; its run-time "
                         f"operand A cannot be transposed")
    x = _dense_input(b, node)
    weight = b.array(node, node.input[1])
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if attrs.get("transB", 0):
        weight = weight.T
    n = weight.shape[1]
    if attrs.get("transB", 0) or alpha != 1.0:
        w_name = b.new_constant(f"{node.name}_weight", weight * np.float32(alpha))
    else:
        w_name = b.constant(node, node.input[1])
    inputs = [x, w_name]
    if len(node.input) > 2 and node.input[2]:
        c = b.array(node, node.input[2])
        if c.shape not in ((n,), (1, n)):
            raise ModelError(f"Gemm '{node.name}' must have C of shape [{n}] or [1, {n}], not "
                             f"{list(c.shape)}")
        inputs.append(b.constant(node, node.input[2]) if c.shape == (n,) and beta == 1.0 else
                      b.new_constant(f"{node.name}_bias", c.reshape(n) * np.float32(beta)))
    return Node(node.name, "Dense", inputs, (b.value(node.output[0]),), dict(NO_ACTIVATION))


def _matmul(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    x = _dense_input(b, node)
    if b.onnx_constants[node.input[1]].ndim != 2:
        raise ModelError(f"MatMul '{node.name}' must have a 2-D second operand, not "
                         f"{list(b.onnx_constants[node.input[1]].shape)}")
    return Node(node.name, "Dense", (x, b.constant(node, node.input[1])),
                (b.value(node.output[0]),), dict(NO_ACTIVATION))


def _add(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    a, c = node.input
    if a not in b.onnx_constants and c not in b.onnx_constants \
            and b.shape(b.value(a)) != b.shape(b.value(c)):
        return convert_eltwise(b, node)      # a broadcast: the element-wise engine, or refused
    if a in b.onnx_constants:                # constant second, the form fuse-bias looks for
        a, c = c, a
    c = b.constant(node, c) if c in b.onnx_constants else b.value(c)
    return Node(node.name, "Add", (b.value(a), c), (b.value(node.output[0]),),
                dict(NO_ACTIVATION))


def _relu(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    return Node(node.name, "Relu", (b.value(node.input[0]),), (b.value(node.output[0]),))


def _table_activation(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    """A table operator of :data:`hwonnx.ir.tables.TABLE_OPS` (``LeakyRelu``, ``Sigmoid``,
    ``Elu``, ``Gelu``, ...): an elementwise function the accelerator computes by a lookup table
    on the int8 value. Its attributes, ONNX's defaults filled in, are kept."""
    table = TABLE_OPS[node.op_type]
    attrs = dict(table.defaults)
    for key, value in node_attrs(node).items():
        if key not in table.defaults:
            continue
        if isinstance(table.defaults[key], str):
            if value not in table.choices.get(key, (table.defaults[key],)):
                allowed = " or ".join(f"'{c}'" for c in table.choices.get(key, ()))
                raise ModelError(f"{node.op_type} '{node.name}' has {key}='{value}'; ONNX "
                                 f"defines {allowed}")
            attrs[key] = str(value)
        else:
            attrs[key] = float(value)
    return Node(node.name, node.op_type, (b.value(node.input[0]),), (b.value(node.output[0]),),
                attrs)


def _clip_bound(b: GraphBuilder, node: onnx.NodeProto, index: int, attrs: dict, key: str,
                lower: bool) -> "float | None":
    """Return the ``min`` (``lower``) or ``max`` bound of a Clip, None when it is absent or
    unbounded (-inf / the lowest float for ``min``, +inf / the largest float for ``max``)."""
    limit = float(np.finfo(np.float32).max)
    if len(node.input) > index and node.input[index]:
        raw = np.asarray(b.onnx_constants[node.input[index]])
        if raw.size != 1 or (raw.dtype.kind != "f" and str(raw.dtype) != "bfloat16"):
            raise ModelError(f"Clip '{node.name}' needs a floating-point scalar {key}, not "
                             f"{raw.dtype} of shape {list(raw.shape)}")
        value = float(raw.reshape(-1)[0])
        if raw.dtype.kind == "f":                         # float16's largest value is 65504
            limit = min(limit, float(np.finfo(raw.dtype).max))
    elif key in attrs:                                    # opset < 11
        value = float(attrs[key])
    else:
        return None
    if math.isnan(value):
        raise ModelError(f"Clip '{node.name}' has {key}=NaN")
    if (lower and value <= -limit) or (not lower and value >= limit):
        return None
    if not math.isfinite(value):
        raise ModelError(f"Clip '{node.name}' has {key}={value}, which clips every value")
    return value


def _clip(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    low = _clip_bound(b, node, 1, attrs, "min", lower=True)
    high = _clip_bound(b, node, 2, attrs, "max", lower=False)
    x, y = b.value(node.input[0]), b.value(node.output[0])
    if low is None and high is None:
        return Node(node.name, "Identity", (x,), (y,))
    return Node(node.name, "Clip", (x,), (y,), {"min": low, "max": high})


def convert_softmax(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    """The IR ``Softmax`` of an ONNX Softmax (one axis); :mod:`.host` converts a host step's
    Softmax with it too."""
    x = b.value(node.input[0])
    rank = len(b.shape(x))
    axis = node_attrs(node).get("axis", -1)                  # opset >= 13 (older is converted)
    if not -rank <= axis < rank:
        raise ModelError(f"Softmax '{node.name}' has axis={axis}, out of range for its "
                         f"rank-{rank} input")
    return Node(node.name, "Softmax", (x,), (b.value(node.output[0]),),
                {"axis": axis + rank if axis < 0 else axis})


def _check_unused(b: GraphBuilder, node: onnx.NodeProto, what: str) -> None:
    extra = [value for value in node.output[1:] if value and value in b.used]
    if extra:
        raise ModelError(f"{node.op_type} '{node.name}' output '{extra[0]}' ({what}) must be "
                         f"unused; hwonnx runs inference only")


def _batchnorm(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    attrs = node_attrs(node)
    if attrs.get("training_mode", 0):
        raise ModelError(f"BatchNormalization '{node.name}' must have training_mode=0, not 1; "
                         f"hwonnx runs inference only")
    _check_unused(b, node, "a training statistic")
    shape = b.shape(node.input[0])
    channels = shape[1] if len(shape) > 1 else 1
    for index, role in enumerate(("scale", "B", "input_mean", "input_var"), start=1):
        check_per_channel(b, node, index, role, channels, "channel")
    epsilon = float(attrs.get("epsilon", 1e-5))
    if not np.all(np.asarray(b.onnx_constants[node.input[4]], np.float64) + epsilon > 0):
        raise ModelError(f"BatchNormalization '{node.name}' has input_var '{node.input[4]}' "
                         f"with variance + epsilon <= 0 (or NaN); it must be > 0")
    inputs = [b.value(node.input[0])] + [b.constant(node, v) for v in node.input[1:5]]
    return Node(node.name, "BatchNorm", inputs, (b.value(node.output[0]),), {"epsilon": epsilon})


def _flatten(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    x = b.value(node.input[0])
    axis = node_attrs(node).get("axis", 1)
    axis = axis + len(b.shape(x)) if axis < 0 else axis
    return Node(node.name, "Flatten", (x,), (b.value(node.output[0]),), {"axis": axis})


def _reshape(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    x = b.value(node.input[0])
    source = b.shape(x)
    target = [int(v) for v in b.onnx_constants[node.input[1]]]
    if not node_attrs(node).get("allowzero", 0):
        target = [source[i] if v == 0 else v for i, v in enumerate(target)]
    if -1 in target:
        known = math.prod(v for v in target if v != -1)
        target[target.index(-1)] = math.prod(source) // known if known else 0
    out = b.value(node.output[0])
    if tuple(target) != b.shape(out) or math.prod(target) != math.prod(source):
        raise ModelError(f"Reshape '{node.name}' resolves its shape to {target}, which does not "
                         f"match input {list(source)} and output {list(b.shape(out))}")
    return Node(node.name, "Reshape", (x,), (out,), {"shape": tuple(target)})


def _identity(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    return Node(node.name, "Identity", (b.value(node.input[0]),), (b.value(node.output[0]),))


def _dropout(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    _check_unused(b, node, "the dropout mask")
    training = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if training and bool(np.asarray(b.onnx_constants[training]).reshape(-1)[0]):
        raise ModelError(f"Dropout '{node.name}' must have training_mode false, not true; "
                         f"hwonnx runs inference only")
    return _identity(b, node)


#: The largest ``K`` of a ``[1, K]`` tensor scaled per element through a diagonal ``Dense``.
DIAGONAL_MAX = 4096


def mul_maps(shape: "tuple[int, ...]", out_shape: "tuple[int, ...]",
             scale_shape: "tuple[int, ...]") -> bool:
    """Whether a ``Mul`` of a run-time ``shape`` by a constant of ``scale_shape`` maps to the
    array: a scalar or per-channel scale of a 4-D input (a depthwise 1x1 ``Conv``) or of a
    ``[1, K]`` input with ``K <= DIAGONAL_MAX`` (a diagonal ``Dense``)."""
    rank = len(shape)
    padded = tuple(scale_shape) if len(scale_shape) > rank else \
        (1,) * (rank - len(scale_shape)) + tuple(scale_shape)
    channels = shape[1] if rank >= 2 else 0
    return rank in (2, 4) and tuple(out_shape) == tuple(shape) and padded[1] in (1, channels) \
        and all(d == 1 for i, d in enumerate(padded) if i != 1) \
        and (rank == 4 or (shape[0] == 1 and channels <= DIAGONAL_MAX))


def _mul(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    a, c = node.input
    if a not in b.onnx_constants and c not in b.onnx_constants:
        return convert_eltwise(b, node)      # two computed tensors: the element-wise engine
    if a in b.onnx_constants:                 # the run-time operand first
        a, c = c, a
    x, out = b.value(a), b.value(node.output[0])
    shape, scale = b.shape(x), b.array(node, c)
    channels = shape[1] if len(shape) >= 2 else 0
    if mul_maps(shape, b.shape(out), scale.shape):
        per_channel = np.broadcast_to(scale.reshape(-1), (channels,))
        weight = b.new_constant(f"{node.name}_weight", channel_weight(shape, per_channel))
        return channel_scale_node(node.name, (x, weight), out, shape)
    raise unsupported(b, node, (
        f"Mul '{node.name}' multiplies '{x}' of shape {list(shape)} by a constant of shape "
        f"{list(scale.shape)}; hwonnx maps only a scalar or per-channel constant ([C, 1, 1], "
        f"[1, C, 1, 1]) on a 4-D input (a depthwise 1x1 Conv) or a scalar, [K] or [1, K] "
        f"constant on a [1, K] input with K <= {DIAGONAL_MAX} (a diagonal Dense)"))


def _as_reshape(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    """``Squeeze``/``Unsqueeze`` (and a ``Transpose`` moving only size-1 axes): a ``Reshape``
    to the inferred output shape."""
    x, out = b.value(node.input[0]), b.value(node.output[0])
    if math.prod(b.shape(x)) != math.prod(b.shape(out)):
        raise ModelError(f"{node.op_type} '{node.name}' maps input {list(b.shape(x))} to output "
                         f"{list(b.shape(out))}, which has a different number of elements")
    return Node(node.name, "Reshape", (x,), (out,), {"shape": tuple(b.shape(out))})


def transpose_is_reshape(shape: "tuple[int, ...]", perm: "list[int]") -> bool:
    """Whether ``perm`` keeps the relative order of the axes of size > 1 of ``shape`` (only
    size-1 axes move, so the data order is unchanged: a reshape)."""
    moved = [axis for axis in perm if shape[axis] != 1]
    return moved == sorted(moved)


def _transpose(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    """A ``Reshape`` when only size-1 axes move; else a ``Permute`` of a ``[1, C, H, W]``
    image (the batch axis in place), which the ``fold-transpose`` pass removes where another
    cancels it or a ``Dense`` after a ``Flatten`` can take it into its weights, and the array
    copies otherwise."""
    x = b.value(node.input[0])
    shape = b.shape(x)
    perm = tuple(int(p) for p in node_attrs(node).get("perm", range(len(shape) - 1, -1, -1)))
    if transpose_is_reshape(shape, list(perm)):
        return _as_reshape(b, node)
    if (len(shape) != 4 or shape[0] != 1 or perm[0] != 0) \
            and not _in_channel_shuffle(b, node, perm):
        raise unsupported(b, node, (
            f"Transpose '{node.name}' has perm {list(perm)} on a value of shape {list(shape)}; "
            f"the array moves the channel, height and width axes of a [1, C, H, W] image"))
    return Node(node.name, "Permute", (x,), (b.value(node.output[0]),),
                {"perm": perm, **NO_ACTIVATION})


#: ONNX operators that only relabel the axes (mapped to ``Reshape``, ``Flatten`` or
#: ``Identity``), which a channel shuffle may have around its ``Transpose``.
_RELABELLING = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})


def _in_channel_shuffle(b: GraphBuilder, node: onnx.NodeProto, perm) -> bool:
    """Whether the ``Transpose`` ``node`` is the middle of a channel shuffle: between
    relabelling nodes going from a ``[1, C, H, W]`` value to the next value of that shape,
    it permutes whole channels (:func:`hwonnx.passes.channel_shuffle.channel_order`; the
    ``channel-shuffle`` pass makes it one ``ChannelPermute``)."""
    def only_reader(value: str, reader: onnx.NodeProto) -> bool:
        readers = b.readers.get(value, [])
        return value not in b.outputs and len(readers) == 1 and readers[0] is reader

    source, reader = node.input[0], node
    while True:
        producer = b.producer.get(source)
        if producer is None or producer.op_type not in _RELABELLING \
                or not only_reader(source, reader):
            break
        source, reader = producer.input[0], producer
    shape, value, steps = b.shape(source), node.output[0], source != node.input[0]
    while b.shape(value) != shape or not steps:
        readers = b.readers.get(value, [])
        if not only_reader(value, readers[0] if readers else None) \
                or readers[0].op_type not in _RELABELLING or readers[0].input[0] != value:
            return False
        value, steps = readers[0].output[0], True
    return channel_order(shape, b.shape(node.input[0]), perm, shape) is not None


def _pad(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    """A transient ``Pad`` node {``pads``: (top, left, bottom, right), ``value`` if not 0},
    folded into the padding of the layers reading it by the ``fold-pad`` pass (any ``Pad``
    left is refused)."""
    x, out = b.value(node.input[0]), b.value(node.output[0])
    rank = len(b.shape(x))
    pads = [int(v) for v in np.asarray(b.onnx_constants[node.input[1]]).reshape(-1)]
    axes = list(range(rank))
    if len(node.input) > 3 and node.input[3]:
        axes = [int(a) + (rank if a < 0 else 0)
                for a in np.asarray(b.onnx_constants[node.input[3]]).reshape(-1)]
    full = [0] * (2 * rank)
    for i, axis in enumerate(axes):
        full[axis], full[axis + rank] = pads[i], pads[i + len(axes)]
    mode = node_attrs(node).get("mode", "constant")
    if mode != "constant":
        return pad_by_copies(b, node, x, out, full, mode)
    value = 0.0
    if len(node.input) > 2 and node.input[2]:
        values = np.asarray(b.onnx_constants[node.input[2]]).reshape(-1)
        if values.size != 1:
            raise ModelError(f"Pad '{node.name}': its constant_value '{node.input[2]}' must hold "
                             f"one value, not {values.size}")
        value = float(values[0])
    if rank != 4 or math.isnan(value) or value == math.inf or any(p < 0 for p in full) \
            or any(full[a] or full[a + rank] for a in (0, 1)):
        raise unsupported(b, node, (
            f"Pad '{node.name}' pads a {rank}-D input by {full} with value {value:g}; only "
            f"non-negative constant padding (not NaN or +inf) of the two spatial axes of a 4-D "
            f"input (folded into the padding of the Conv, AveragePool or MaxPool reading it) "
            f"is supported"))
    if not any(full):
        return Node(node.name, "Identity", (x,), (out,))
    return Node(node.name, "Pad", (x,), (out,), {"pads": (full[2], full[3], full[6], full[7]),
                                                 **({"value": value} if value else {})})


#: Names of the axes a ``Concat`` cannot join, by input rank.
_AXIS_NAMES = {4: ("batch", "channel", "height", "width"), 2: ("batch", "feature")}


def _concat(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    """``Concat`` of run-time tensors: of ``[1, C_j, H, W]`` images along the channel, height
    or width axis, or of ``[1, K_j]`` vectors along axis 1 (a single input is an
    ``Identity``)."""
    constant = next((v for v in node.input if v in b.onnx_constants), None)
    if constant is not None:
        raise unsupported(b, node, (
            f"Concat '{node.name}' joins the constant '{constant}' to values computed at run "
            f"time; only run-time inputs can be concatenated"))
    xs = [b.value(v) for v in node.input]
    out = b.value(node.output[0])
    shape = b.shape(xs[0])
    rank = len(shape)
    axis = int(node_attrs(node).get("axis", 1))     # required (shape inference checks it)
    if not -rank <= axis < rank:
        raise ModelError(f"Concat '{node.name}' has axis={axis}, out of range for its rank-{rank} "
                         f"inputs")
    axis = axis + rank if axis < 0 else axis
    if rank not in _AXIS_NAMES or shape[0] != 1:
        raise unsupported(b, node, (
            f"Concat '{node.name}' joins values of shape {list(shape)}; only [1, C, H, W] "
            f"images and [1, K] vectors can be concatenated"))
    if axis == 0 or (rank == 2 and axis != 1):
        raise unsupported(b, node, (
            f"Concat '{node.name}' along axis {axis} ({_AXIS_NAMES[rank][axis]}) has no "
            f"hardware mapping; only the channel, height and width axes are supported"))
    if len(xs) == 1:
        return Node(node.name, "Identity", (xs[0],), (out,))
    return Node(node.name, "Concat", xs, (out,), {"axis": axis, **NO_ACTIVATION})



CONVERTERS: "dict[str, Callable[[GraphBuilder, onnx.NodeProto], Node]]" = {
    "Conv": _conv, "Gemm": _gemm, "MatMul": _matmul, "Add": _add, "Relu": _relu,
    "BatchNormalization": _batchnorm, "Flatten": _flatten, "Reshape": _reshape,
    "Identity": _identity, "Dropout": _dropout, "AveragePool": _average_pool,
    "GlobalAveragePool": _global_average_pool, "Clip": _clip,
    "Mul": _mul, "Squeeze": _as_reshape, "Unsqueeze": _as_reshape, "Transpose": _transpose,
    "Pad": _pad, "Concat": _concat, "MaxPool": _max_pool, "GlobalMaxPool": _global_max_pool,
    "ReduceMean": _reduce_pool, "ReduceMax": _reduce_pool,
    "Sub": convert_eltwise, "Max": convert_eltwise, "Min": convert_eltwise,
    "Sum": convert_eltwise, "Mean": convert_eltwise, "PRelu": convert_prelu,
    **{op: _table_activation for op, table in TABLE_OPS.items() if table.onnx},
    **UPSAMPLE_CONVERTERS, **SLICING_CONVERTERS,
}


def convert_graph(model: onnx.ModelProto, nodes: "list[onnx.NodeProto]", constants: dict,
                  types: dict, meta: "dict | None" = None,
                  special: "dict[str, Callable] | None" = None) -> Graph:
    """Build the float IR graph from the folded nodes of ``model``.

    Parameters
    ----------
    model : onnx.ModelProto
        The bound, shape-inferred model (for its signature and metadata).
    nodes : list of onnx.NodeProto
        The nodes left after constant folding, all of supported compute operators.
    constants : dict of str to numpy.ndarray
        Initializers and folded values.
    types : dict
        ``(elem_type, shape)`` of each value, from shape inference.
    meta : dict, optional
        The graph's metadata; the converter appends its notes (dtype conversions) to
        ``meta["notes"]``.
    special : dict of str to converter, optional
        Converters of particular nodes, by node name, used instead of ``CONVERTERS`` (the
        host steps, :mod:`.host`).

    Raises
    ------
    UnsupportedOperatorError
        Listing every node that uses a supported operator in a form hwonnx cannot map.
    ModelError
        If a node is malformed.
    ResourceError
        If a value, or the work of a node, exceeds hwonnx's bounds
        (:func:`hwonnx.ir.evaluate.check_node_work`).
    """
    b = GraphBuilder(model, nodes, constants, types)
    graph = model.graph
    ir_nodes, refused, reasons = [], [], []
    for node in nodes:
        converter = (special or {}).get(node.name) or CONVERTERS.get(node.op_type)
        if converter is None:                 # the support check lets no other op through
            raise NotImplementedError(f"No converter for {node.op_type} (node '{node.name}')")
        try:
            made = converter(b, node)         # a Node, or a list of them (a Split)
        except UnsupportedOperatorError as error:     # go on: one error lists every node
            refused += error.nodes
            reasons += getattr(error, "reasons", [])
            continue
        except HwonnxError:
            if refused:          # (may follow from a refused node's output): report those
                continue
            raise
        for ir_node in made if isinstance(made, list) else [made]:
            if ir_node.op not in IR_OPS:      # every float IR op is registered: a bug
                raise NotImplementedError(f"Converter of {node.op_type} (node '{node.name}') "
                                          f"made {ir_node.op}, not in hwonnx.ir.ops.IR_OPS")
            if ir_node.op != "Pad":           # transient: fold-pad moves it into the layer
                check_node_work(ir_node, b.types)
            ir_nodes.append(ir_node)
    if refused:
        error = UnsupportedOperatorError(refused)
        error.args = (summary(error, reasons),)
        raise error
    # after the nodes: a host Cast gives an integer input its type
    inputs = tuple(b.value(value.name) for value in graph.input)
    outputs = []
    for value in graph.output:
        if value.name in constants:
            outputs.append(b.constant(None, value.name))
        else:
            outputs.append(b.value(value.name))
    meta = dict(meta or {})
    meta["notes"] = tuple(meta.get("notes", ())) + tuple(
        n for n in b.notes if n not in meta.get("notes", ()))
    return Graph(ir_nodes, inputs, tuple(outputs), b.types, b.constants, meta)
