"""Conversion of folded ONNX nodes to the float IR vocabulary of :mod:`hwonnx.ir.graph`; one
function per ONNX operator, all registered in ``CONVERTERS``."""

import math
from typing import Callable

import numpy as np
import onnx

from ..errors import ModelError
from ..ir.graph import Graph, Node, TensorType
from .common import FLOAT_TYPES, MAX_TENSOR_ELEMENTS, elem_type_name

__all__ = ["CONVERTERS", "convert_graph"]


class _Builder:
    """Collects the IR constants and types while the nodes are converted."""

    def __init__(self, model: onnx.ModelProto, nodes, constants: dict, types: dict):
        self.onnx_constants = constants
        self.onnx_types = types
        self.constants: "dict[str, np.ndarray]" = {}
        self.types: "dict[str, TensorType]" = {}
        self.notes: "list[str]" = []
        self.taken = set(types) | set(constants)
        self.used = {v for node in nodes for v in node.input} | \
            {value.name for value in model.graph.output}

    def _note_dtype(self, dtype: str) -> None:
        if dtype != "float32":
            note = f"Converted {dtype} values to float32"
            if note not in self.notes:
                self.notes.append(note)

    def array(self, node: "onnx.NodeProto | None", name: str) -> np.ndarray:
        """Return the float32 value of the constant ``name`` read by ``node`` (None for a
        graph output)."""
        value = self.onnx_constants[name]
        if value.dtype.kind != "f" and str(value.dtype) != "bfloat16":
            user = f"Node '{node.name}' ({node.op_type})" if node else "The graph output"
            raise ModelError(f"{user} needs a floating-point constant '{name}', not "
                             f"{value.dtype}")
        self._note_dtype(str(value.dtype))
        with np.errstate(over="ignore", invalid="ignore"):
            value = value.astype(np.float32)
        if not np.all(np.isfinite(value)):
            user = f"Node '{node.name}' ({node.op_type})" if node else "The graph output"
            raise ModelError(f"{user} reads constant '{name}', which holds non-finite values "
                             f"(NaN or infinity) in float32; hwonnx quantizes only finite "
                             f"values")
        return value

    def constant(self, node: "onnx.NodeProto | None", name: str) -> str:
        """Register the ONNX constant ``name`` as an IR constant and return its name."""
        if name not in self.constants:
            value = self.array(node, name)
            self.constants[name] = value
            self.types[name] = TensorType("float32", tuple(value.shape))
        return name

    def new_constant(self, base: str, value: np.ndarray) -> str:
        """Add a constant made by the converter under a fresh name derived from ``base``."""
        name, index = base, 1
        while name in self.taken:
            name, index = f"{base}_{index}", index + 1
        self.taken.add(name)
        self.constants[name] = np.ascontiguousarray(value, dtype=np.float32)
        self.types[name] = TensorType("float32", tuple(value.shape))
        return name

    def value(self, name: str) -> str:
        """Register the type of the run-time value ``name`` and return its name."""
        if name not in self.types:
            elem_type, shape = self.onnx_types.get(name, (0, None))
            if elem_type not in FLOAT_TYPES:
                raise ModelError(f"Value '{name}' must be floating point, not "
                                 f"{elem_type_name(elem_type)}")
            if shape is None:
                raise ModelError(f"Shape inference could not give '{name}' a static shape")
            if math.prod(shape) > MAX_TENSOR_ELEMENTS:
                raise ModelError(f"Value '{name}' has shape {list(shape)}, "
                                 f"{math.prod(shape)} elements, more than hwonnx's limit of "
                                 f"{MAX_TENSOR_ELEMENTS}")
            self._note_dtype(FLOAT_TYPES[elem_type])
            self.types[name] = TensorType("float32", shape)
        return name

    def shape(self, name: str) -> "tuple[int, ...]":
        return self.types[self.value(name)].shape


def _attrs(node: onnx.NodeProto) -> dict:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    attrs = {k: v.decode(errors="replace") if isinstance(v, bytes) else v
             for k, v in attrs.items()}
    for key, value in attrs.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ModelError(f"{node.op_type} '{node.name}' has attribute {key}={value}; it must "
                             f"be finite")
    return attrs


def _conv(b: _Builder, node: onnx.NodeProto) -> Node:
    x, attrs = b.value(node.input[0]), _attrs(node)
    shape = b.shape(x)
    if len(shape) != 4:
        raise ModelError(f"Conv '{node.name}' must be a 2-D convolution (4-D input), not "
                         f"{len(shape) - 2}-D")
    weight = b.onnx_constants[node.input[1]]
    kernel = tuple(attrs.get("kernel_shape", weight.shape[2:]))
    if kernel != tuple(weight.shape[2:]):
        raise ModelError(f"Conv '{node.name}' has kernel_shape {list(kernel)}, but its weight "
                         f"has shape {list(weight.shape)}")
    strides = tuple(attrs.get("strides", (1, 1)))
    dilations = tuple(attrs.get("dilations", (1, 1)))
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad == "NOTSET":
        pads = tuple(attrs.get("pads", (0, 0, 0, 0)))
    elif auto_pad == "VALID":
        pads = (0, 0, 0, 0)
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, k, s, d in zip(shape[2:], kernel, strides, dilations):
            total = max(0, (math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size)
            first = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            begin.append(first)
            end.append(total - first)
        pads = (*begin, *end)
    else:
        raise ModelError(f"Conv '{node.name}' has auto_pad '{auto_pad}'; it must be NOTSET, "
                         f"VALID, SAME_UPPER or SAME_LOWER")
    inputs = [x, b.constant(node, node.input[1])]
    if len(node.input) > 2 and node.input[2]:
        inputs.append(b.constant(node, node.input[2]))
    return Node(node.name, "Conv", inputs, (b.value(node.output[0]),),
                {"strides": strides, "pads": pads, "dilations": dilations, "relu": False})


def _dense_input(b: _Builder, node: onnx.NodeProto) -> str:
    x = b.value(node.input[0])
    if len(b.shape(x)) != 2 or b.shape(x)[0] != 1:
        raise ModelError(f"{node.op_type} '{node.name}' must read a [1, K] input, not "
                         f"{list(b.shape(x))}; it maps to Dense, which computes one row")
    return x


def _gemm(b: _Builder, node: onnx.NodeProto) -> Node:
    attrs = _attrs(node)
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
        inputs.append(b.new_constant(f"{node.name}_bias", c.reshape(n) * np.float32(beta)))
    return Node(node.name, "Dense", inputs, (b.value(node.output[0]),), {"relu": False})


def _matmul(b: _Builder, node: onnx.NodeProto) -> Node:
    x = _dense_input(b, node)
    if b.onnx_constants[node.input[1]].ndim != 2:
        raise ModelError(f"MatMul '{node.name}' must have a 2-D second operand, not "
                         f"{list(b.onnx_constants[node.input[1]].shape)}")
    return Node(node.name, "Dense", (x, b.constant(node, node.input[1])),
                (b.value(node.output[0]),), {"relu": False})


def _add(b: _Builder, node: onnx.NodeProto) -> Node:
    a, c = node.input
    if a in b.onnx_constants:                # constant second, the form fuse-bias looks for
        a, c = c, a
    c = b.constant(node, c) if c in b.onnx_constants else b.value(c)
    return Node(node.name, "Add", (b.value(a), c), (b.value(node.output[0]),))


def _relu(b: _Builder, node: onnx.NodeProto) -> Node:
    return Node(node.name, "Relu", (b.value(node.input[0]),), (b.value(node.output[0]),))


def _check_unused(b: _Builder, node: onnx.NodeProto, what: str) -> None:
    extra = [value for value in node.output[1:] if value and value in b.used]
    if extra:
        raise ModelError(f"{node.op_type} '{node.name}' output '{extra[0]}' ({what}) must be "
                         f"unused; hwonnx runs inference only")


def _batchnorm(b: _Builder, node: onnx.NodeProto) -> Node:
    attrs = _attrs(node)
    if attrs.get("training_mode", 0):
        raise ModelError(f"BatchNormalization '{node.name}' must have training_mode=0, not 1; "
                         f"hwonnx runs inference only")
    _check_unused(b, node, "a training statistic")
    inputs = [b.value(node.input[0])] + [b.constant(node, v) for v in node.input[1:5]]
    return Node(node.name, "BatchNorm", inputs, (b.value(node.output[0]),),
                {"epsilon": float(attrs.get("epsilon", 1e-5))})


def _flatten(b: _Builder, node: onnx.NodeProto) -> Node:
    x = b.value(node.input[0])
    axis = _attrs(node).get("axis", 1)
    axis = axis + len(b.shape(x)) if axis < 0 else axis
    return Node(node.name, "Flatten", (x,), (b.value(node.output[0]),), {"axis": axis})


def _reshape(b: _Builder, node: onnx.NodeProto) -> Node:
    x = b.value(node.input[0])
    source = b.shape(x)
    target = [int(v) for v in b.onnx_constants[node.input[1]]]
    if not _attrs(node).get("allowzero", 0):
        target = [source[i] if v == 0 else v for i, v in enumerate(target)]
    if -1 in target:
        known = math.prod(v for v in target if v != -1)
        target[target.index(-1)] = math.prod(source) // known if known else 0
    out = b.value(node.output[0])
    if tuple(target) != b.shape(out) or math.prod(target) != math.prod(source):
        raise ModelError(f"Reshape '{node.name}' resolves its shape to {target}, which does not "
                         f"match input {list(source)} and output {list(b.shape(out))}")
    return Node(node.name, "Reshape", (x,), (out,), {"shape": tuple(target)})


def _identity(b: _Builder, node: onnx.NodeProto) -> Node:
    return Node(node.name, "Identity", (b.value(node.input[0]),), (b.value(node.output[0]),))


def _dropout(b: _Builder, node: onnx.NodeProto) -> Node:
    _check_unused(b, node, "the dropout mask")
    training = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if training and bool(np.asarray(b.onnx_constants[training]).reshape(-1)[0]):
        raise ModelError(f"Dropout '{node.name}' must have training_mode false, not true; "
                         f"hwonnx runs inference only")
    return _identity(b, node)


CONVERTERS: "dict[str, Callable[[_Builder, onnx.NodeProto], Node]]" = {
    "Conv": _conv, "Gemm": _gemm, "MatMul": _matmul, "Add": _add, "Relu": _relu,
    "BatchNormalization": _batchnorm, "Flatten": _flatten, "Reshape": _reshape,
    "Identity": _identity, "Dropout": _dropout,
}


def convert_graph(model: onnx.ModelProto, nodes: "list[onnx.NodeProto]", constants: dict,
                  types: dict, meta: "dict | None" = None) -> Graph:
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

    Raises
    ------
    ModelError
        If a node uses a supported operator in a form hwonnx cannot map.
    """
    b = _Builder(model, nodes, constants, types)
    graph = model.graph
    inputs = tuple(b.value(value.name) for value in graph.input)
    ir_nodes = []
    for node in nodes:
        converter = CONVERTERS.get(node.op_type)
        if converter is None:                 # the support check lets no other op through
            raise NotImplementedError(f"No converter for {node.op_type} (node '{node.name}')")
        ir_nodes.append(converter(b, node))
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
