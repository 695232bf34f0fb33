"""Conversion of folded ONNX nodes to the float IR vocabulary of :mod:`hwonnx.ir.graph`; one
function per ONNX operator, all registered in ``CONVERTERS``: the dense layers, activations,
``BatchNormalization``, ``Mul`` and ``Pad`` here, the other operators by kind in
:mod:`.conv_pool`, :mod:`.layout`, :mod:`.eltwise`, :mod:`.slicing` and :mod:`.upsample`."""

import math
from typing import Callable

import numpy as np
import onnx

from ..errors import HwonnxError, ModelError, UnsupportedOperatorError
from ..ir.evaluate import check_node_work
from ..ir.graph import Graph, Node
from ..ir.ops import IR_OPS
from ..ir.tables import TABLE_OPS
from ..passes.rewrite import channel_scale_node, channel_weight
from .builder import (NO_ACTIVATION, GraphBuilder, check_per_channel, check_unused, node_attrs,
                      unsupported)
from .common import summary
from .conv_pool import CONV_POOL_CONVERTERS
from .eltwise import convert_eltwise, convert_prelu
from .layout import LAYOUT_CONVERTERS
from .slicing import SLICING_CONVERTERS, pad_by_copies
from .upsample import UPSAMPLE_CONVERTERS

__all__ = ["CONVERTERS", "convert_graph", "convert_softmax"]


def _dense_input(b: GraphBuilder, node: onnx.NodeProto) -> str:
    """The ``[1, K]`` run-time input of a ``Gemm`` or ``MatMul`` (a ``MatMul`` of tokens
    ``[1, ..., T, K]`` is a 1x1 ``Conv`` by now: :mod:`.tokens`)."""
    x = b.value(node.input[0])
    if len(b.shape(x)) != 2 or b.shape(x)[0] != 1:
        if node.op_type == "MatMul":
            raise ModelError(f"MatMul '{node.name}' must read a [1, K] row or [1, ..., T, K] "
                             f"tokens (every axis before the last two of size 1), not "
                             f"{list(b.shape(x))}; a row maps to Dense, tokens to a 1x1 Conv "
                             f"over the T tokens")
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
    if b.onnx_constants[node.input[1]].ndim != 2:
        raise ModelError(f"MatMul '{node.name}' must have a 2-D second operand, not "
                         f"{list(b.onnx_constants[node.input[1]].shape)}")
    x = _dense_input(b, node)
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


def _batchnorm(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    attrs = node_attrs(node)
    if attrs.get("training_mode", 0):
        raise ModelError(f"BatchNormalization '{node.name}' must have training_mode=0, not 1; "
                         f"hwonnx runs inference only")
    check_unused(b, node, "a training statistic")
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


CONVERTERS: "dict[str, Callable[[GraphBuilder, onnx.NodeProto], Node]]" = {
    "Gemm": _gemm, "MatMul": _matmul, "Add": _add, "Relu": _relu,
    "BatchNormalization": _batchnorm, "Clip": _clip, "Mul": _mul, "Pad": _pad,
    "Sub": convert_eltwise, "Max": convert_eltwise, "Min": convert_eltwise,
    "Sum": convert_eltwise, "Mean": convert_eltwise, "PRelu": convert_prelu,
    **{op: _table_activation for op, table in TABLE_OPS.items() if table.onnx},
    **CONV_POOL_CONVERTERS, **LAYOUT_CONVERTERS, **UPSAMPLE_CONVERTERS, **SLICING_CONVERTERS,
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
