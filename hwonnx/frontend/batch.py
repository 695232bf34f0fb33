"""The batch axis: every program hwonnx compiles is a batch-1 program.

The leading axis of a graph input of rank 2 or more is its batch. When it is larger than 1 (a
fixed ``dim_value`` N as PyTorch exports write it, or a symbolic one the user bound to N), the
input is rebound to batch 1, with a warning; ``sim`` and ``run`` stream the samples through
the program one at a time. That is sound only when the graph treats the samples
independently, so before rebinding, the shapes are inferred with the batch N and every node
that reads a value carrying the batch is checked (:func:`unbatch`):

* its outputs keep the batch as their leading axis, of size N (a ``Reshape``/``Flatten`` that
  folds the batch into the features, a ``Transpose`` that moves axis 0, an ``Unsqueeze``
  before axis 0, a ``Concat`` along axis 0 are refused by name);
* it does not work across the batch (an ``axis``/``axes`` attribute naming axis 0, as in a
  ``Softmax`` or ``ArgMax`` over the batch; a ``Gemm`` with ``transA=1`` is refused as it is
  at batch 1);
* an element-wise node does not read a constant whose leading axis runs along the batch (an
  ``Add`` of a ``[N, K]`` constant).

Then the constants that spell the batch are rewritten for batch 1: a constant ``Reshape``
target ``[N, ...]`` becomes ``[1, ...]``, and a ``Squeeze`` without ``axes`` gets the axes it
squeezes at batch N (at batch 1 it would squeeze the batch too). Shapes derived at run time
from ``Shape`` follow by themselves. After the shapes are inferred again with batch 1,
:func:`check_unbatched` checks that every value carrying the batch has the shape it had with
batch N, its leading axis 1 (a batch size spelled by a computed constant would break that).
"""

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import ModelError
from .common import ReadLog, domain_opset, is_default_domain
from .shapes import infer_shapes, value_types

__all__ = ["unbatch", "check_unbatched", "BATCH_WHY"]

#: Why a node that breaks the batch is refused: the end of every such error.
BATCH_WHY = ("hwonnx compiles a batch-1 program and streams the samples through it one at a "
             "time, so the batch must stay the leading axis of every value and no node may "
             "work across it")

#: Operators that work along an ``axis`` attribute (default in parentheses: by opset where it
#: changed) or an ``axes`` attribute or input.
_AXIS_DEFAULTS = {"Softmax": (1, -1), "LogSoftmax": (1, -1), "Hardmax": (1, -1),
                  "ArgMax": (0, 0), "ArgMin": (0, 0), "TopK": (-1, -1), "Concat": (None, None),
                  "Split": (0, 0), "Gather": (0, 0), "LpNormalization": (-1, -1)}
_REDUCE = frozenset({"ReduceMax", "ReduceMin", "ReduceMean", "ReduceSum", "ReduceProd",
                     "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
                     "ReduceSumSquare"})
#: Element-wise operators with NumPy broadcasting.
_BROADCAST = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean",
                        "PRelu", "Where", "Equal", "Greater", "Less", "GreaterOrEqual",
                        "LessOrEqual", "And", "Or", "Xor", "Mod", "BitShift"})
#: Operators whose outputs describe a value's shape, not its samples: they are recomputed
#: with batch 1 by constant folding.
_SHAPE_OPS = frozenset({"Shape", "Size"})


class _Constants:
    """The values of initializers and ``Constant`` nodes, read on demand."""

    def __init__(self, graph: onnx.GraphProto):
        self.inits = {init.name: init for init in graph.initializer}
        self.nodes = {node.output[0]: node for node in graph.node
                      if node.op_type == "Constant" and is_default_domain(node.domain)
                      and node.output}

    def __contains__(self, name: str) -> bool:
        return name in self.inits or name in self.nodes

    def get(self, name: str) -> "np.ndarray | None":
        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        node = self.nodes.get(name)
        if node is None:
            return None
        for attr in node.attribute:
            if attr.name in ("value", "value_int", "value_ints", "value_float",
                             "value_floats"):
                return np.asarray(onnx.helper.get_attribute_value(attr)
                                  if attr.name != "value" else numpy_helper.to_array(attr.t))
        return None


def _ints(attrs: dict, key: str):
    return [int(v) for v in attrs[key]] if key in attrs else None


def unbatch(model: onnx.ModelProto, log: ReadLog) -> "tuple[dict[str, int], dict]":
    """Rebind to 1 the batch of every graph input whose leading axis is larger than 1, in
    place, after checking that the graph keeps the samples apart (module docstring).

    Returns ``(batches, expected)``: the batch of each rebound input (``{}`` when none is, and
    then the model is untouched) and the shape each value carrying the batch must have with
    batch 1 (for :func:`check_unbatched`).

    Raises
    ------
    ModelError
        If a node folds, moves or works across the batch axis; the message names the node,
        the input whose batch it is and why.
    """
    graph = model.graph
    initialized = {init.name for init in graph.initializer}
    batches = {}
    for value in graph.input:
        dims = value.type.tensor_type.shape.dim
        if value.name not in initialized and len(dims) >= 2 and dims[0].dim_value > 1:
            batches[value.name] = int(dims[0].dim_value)
    if not batches:
        return {}, {}
    infer_shapes(model)                          # with batch N
    types = value_types(model)
    constants = _Constants(graph)
    opset = domain_opset(model, "")
    carried = {name: name for name in batches}   # value carrying a batch -> its input
    expected: "dict[str, tuple[int, ...]]" = {}
    rewrites = []
    for node in list(graph.node):
        source = next((carried[v] for v in node.input if v in carried), None)
        if source is None or node.op_type in _SHAPE_OPS or not is_default_domain(node.domain):
            continue
        n = batches[source]
        reason, rewrite = _check_node(node, n, carried, types, constants, opset)
        if reason is None:
            for output in node.output:
                shape = types.get(output, (0, None))[1] if output else None
                if output and (shape is None or not shape or shape[0] != n):
                    reason = _moved(node, output, shape)
                    break
        if reason is not None:
            raise ModelError(f"{node.op_type} '{node.name}' {reason}; axis 0 of input "
                             f"'{source}' is a batch of {n}, and {BATCH_WHY}")
        if rewrite is not None:
            rewrites.append(rewrite)
        for output in node.output:
            if output:
                carried[output] = source
                expected[output] = (1,) + tuple(types[output][1][1:])
    for rewrite in rewrites:
        rewrite(model)
    for value in graph.input:
        if value.name in batches:
            dims = value.type.tensor_type.shape.dim
            declared = "x".join(str(d.dim_value) for d in dims)
            dims[0].dim_value = 1
            single = "x".join(str(d.dim_value) for d in dims)
            expected[value.name] = tuple(d.dim_value for d in dims)
            log.warn(f"Input '{value.name}' has a batch of {batches[value.name]} (shape "
                     f"{declared}); hwonnx compiles a batch-1 program (input shape {single}) "
                     f"and 'sim' and 'run' stream the samples through it one at a time")
    # what shape inference found with batch N must not contradict batch 1: found again
    del graph.value_info[:]
    for value in graph.output:
        value.type.tensor_type.ClearField("shape")
    return batches, expected


def _moved(node: onnx.NodeProto, output: str, shape) -> str:
    """Why ``node``'s ``output`` (of ``shape`` with batch N) no longer carries the batch."""
    where = f"'{output}' of shape {list(shape) if shape is not None else 'unknown'}"
    if node.op_type in ("Reshape", "Flatten"):
        return f"folds the batch axis into the features (its output {where})"
    if node.op_type == "Unsqueeze":
        return f"inserts an axis before the batch axis (its output {where})"
    return f"does not keep the batch as the leading axis of its output {where}"


def _check_node(node: onnx.NodeProto, n: int, carried: dict, types: dict,
                constants: _Constants, opset: int):
    """``(reason, rewrite)`` for a node reading a value that carries a batch of ``n``: the
    reason it breaks the batch (None if it does not) and a function rewriting the model for
    batch 1 (or None)."""
    op = node.op_type
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    x = node.input[0] if node.input else ""
    shape = types.get(x, (0, None))[1]
    rank = len(shape) if shape is not None else 0
    if op == "Transpose" and x in carried and rank:
        perm = _ints(attrs, "perm") or list(range(rank - 1, -1, -1))
        if perm[0] != 0:
            return (f"has perm {perm}, which moves the batch axis to axis "
                    f"{perm.index(0)}"), None
    if op == "Gemm" and x in carried and attrs.get("transA", 0):    # refused anyway
        raise ModelError(f"Gemm '{node.name}' must have transA=0, not transA=1; its run-time "
                         f"operand A cannot be transposed")
    if op in ("Gemm", "MatMul") and any(v in carried for v in node.input[1:]):
        return "reads a value carrying the batch as its second operand", None
    if op in _AXIS_DEFAULTS and x in carried and rank:
        default = _AXIS_DEFAULTS[op][opset >= 13]
        axis = int(attrs.get("axis", default if default is not None else 0))
        if axis + (rank if axis < 0 else 0) == 0:
            return f"works along axis {axis}, the batch axis", None
    if op in _REDUCE and x in carried and rank:
        axes = _ints(attrs, "axes")
        if axes is None and len(node.input) > 1 and node.input[1]:
            value = constants.get(node.input[1])
            axes = None if value is None else [int(a) for a in value.reshape(-1)]
        if axes is None and not attrs.get("noop_with_empty_axes", 0):
            return "reduces every axis, the batch axis too", None
        if axes is not None and any(a + (rank if a < 0 else 0) == 0 for a in axes):
            return f"reduces axes {axes}, which include the batch axis", None
    if op in _BROADCAST:
        out = types.get(node.output[0], (0, None))[1]
        for value in node.input:
            other = types.get(value, (0, None))[1] if value else None
            if value and value not in carried and other is not None and out is not None \
                    and len(other) == len(out) and other[0] != 1:
                return (f"reads '{value}' of shape {list(other)}, whose leading axis runs "
                        f"along the batch"), None
    if op == "Reshape" and x in carried:
        return None, _reshape_rewrite(node, n, types, constants, attrs)
    if op == "Squeeze" and x in carried and shape is not None:
        given = _ints(attrs, "axes") is not None or (len(node.input) > 1 and node.input[1])
        if not given:
            return None, _squeeze_rewrite(node, shape, opset)
    return None, None


def _fresh(model: onnx.ModelProto, base: str) -> str:
    graph = model.graph
    taken = {init.name for init in graph.initializer} | \
        {v for node in graph.node for v in (*node.input, *node.output)} | \
        {value.name for value in graph.input}
    name, index = base, 1
    while name in taken:
        name, index = f"{base}_{index}", index + 1
    return name


def _reshape_rewrite(node, n: int, types: dict, constants: _Constants, attrs: dict):
    """A rewrite of a constant target ``[n, ...]`` of ``node`` to ``[1, ...]`` (None if the
    target does not spell the batch)."""
    if len(node.input) < 2 or node.input[1] not in constants:
        return None
    target = constants.get(node.input[1])
    if target is None or target.ndim != 1 or not target.size or int(target[0]) != n:
        return None
    out = types.get(node.output[0], (0, None))[1]
    if out is None or not out or out[0] != n:
        return None

    def rewrite(model: onnx.ModelProto) -> None:
        single = np.array(target, dtype=np.int64)
        single[0] = 1
        name = _fresh(model, f"{node.input[1]}_batch1")
        model.graph.initializer.append(numpy_helper.from_array(single, name))
        node.input[1] = name
    return rewrite


def _squeeze_rewrite(node, shape: "tuple[int, ...]", opset: int):
    """A rewrite giving a ``Squeeze`` without axes the axes it squeezes at batch N."""
    axes = [axis for axis, size in enumerate(shape) if size == 1]

    def rewrite(model: onnx.ModelProto) -> None:
        if not axes:
            node.op_type = "Identity"
            del node.input[1:]
        elif opset >= 13:
            name = _fresh(model, f"{node.name or node.output[0]}_axes")
            model.graph.initializer.append(
                numpy_helper.from_array(np.array(axes, dtype=np.int64), name))
            del node.input[1:]
            node.input.append(name)
        else:
            node.attribute.append(onnx.helper.make_attribute("axes", axes))
    return rewrite


def check_unbatched(model: onnx.ModelProto, expected: "dict[str, tuple[int, ...]]") -> None:
    """Check that shape inference with batch 1 gives every value carrying the batch the shape
    it had with batch N, its leading axis 1.

    Raises
    ------
    ModelError
        Naming the node whose output differs (its shape depends on the batch size in a way
        hwonnx cannot rewrite, such as a computed constant spelling it).
    """
    if not expected:
        return
    types = value_types(model)
    producer = {v: node for node in model.graph.node for v in node.output if v}
    for name, want in expected.items():
        got = types.get(name, (0, None))[1]
        if got is not None and tuple(got) != want and name in producer:
            node = producer[name]
            raise ModelError(f"{node.op_type} '{node.name}' gives '{name}' shape {list(got)} "
                             f"with batch 1, not {list(want)}: its shape depends on the batch "
                             f"size (a constant that spells it?); {BATCH_WHY}")
