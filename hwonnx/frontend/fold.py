"""Constant folding: evaluate every node whose inputs are constants, and ``Shape`` of any value
whose shape is static, so that only compute nodes reach the converter. No node is evaluated
before the size of its result and its work are known to be within hwonnx's limits, and the
results of one model together are bounded too (:class:`FoldBudget`)."""

import math
import warnings

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from ..errors import ModelError, ResourceError
from .common import MAX_TENSOR_ELEMENTS, copy_fields, extend_messages, opset_versions

__all__ = ["fold_constants", "remove_dead_nodes", "evaluate_node", "output_bound", "fold_work",
           "FoldBudget", "MAX_FOLDED_ELEMENTS", "MAX_FOLD_WORK", "release_initializers"]

#: The results of constant folding in one model may hold at most this many elements together
#: (1 GiB of float32): a few hundred bytes of nodes cannot make gigabytes of constants.
MAX_FOLDED_ELEMENTS = MAX_TENSOR_ELEMENTS
#: The work onnx's reference evaluator may do to fold one node, by operator, in
#: multiply-accumulates (``MatMul``, ``Gemm``, ``Conv``) or window taps (pooling); the
#: evaluator's convolution and pooling are written in Python, hence the lower bounds.
MAX_FOLD_WORK = {"MatMul": 1 << 30, "Gemm": 1 << 30, "Conv": 1 << 26, "AveragePool": 1 << 20,
                 "MaxPool": 1 << 20, "LpPool": 1 << 20}

# Operators whose result has the broadcast shape of their inputs.
_ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Equal", "Greater", "Less", "GreaterOrEqual",
    "LessOrEqual", "And", "Or", "Xor", "Not", "Neg", "Abs", "Relu", "Where", "Max", "Min",
    "Sum", "Mean", "Sqrt", "Exp", "Log", "Reciprocal", "Floor", "Ceil", "Round", "Sign",
    "Clip", "Cast", "Identity", "BitShift", "Mod", "Sigmoid", "Tanh", "EyeLike", "Trilu",
    "CumSum",
})
# Operators whose result has at most as many elements as all their inputs together.
_NOT_GROWING = frozenset({
    "Concat", "Slice", "Squeeze", "Unsqueeze", "Flatten", "Reshape", "Transpose", "Shape",
    "Size", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ArgMax",
    "ArgMin", "Dropout", "BatchNormalization", "Split",
})


def output_bound(node: onnx.NodeProto, inputs: "list[np.ndarray]",
                 static: "list[tuple[int, ...] | None]") -> "int | None":
    """Return an upper bound on the elements of any output of ``node`` evaluated on
    ``inputs``, or None when none is known before evaluation. ``static`` gives the
    shape-inferred output shapes (None where unknown)."""
    if node.op_type == "Constant":
        return 0                     # its value is stored in the model, already size-checked
    if static and all(shape is not None for shape in static):
        return max((math.prod(shape) for shape in static), default=0)
    sizes = [int(a.size) for a in inputs]
    if node.op_type in _ELEMENTWISE:
        try:
            return math.prod(np.broadcast_shapes(*[a.shape for a in inputs]))
        except ValueError:
            return max(sizes, default=1)             # the evaluator reports the mismatch
    if node.op_type in _NOT_GROWING:
        return sum(sizes) + 1
    if node.op_type == "Gather" and len(inputs) == 2:
        return sizes[0] * max(sizes[1], 1)
    if node.op_type == "Size":
        return 1
    return _shaped_bound(node.op_type, inputs)


def _shaped_bound(op: str, inputs: "list[np.ndarray]") -> "int | None":
    """The exact output size of a ``ConstantOfShape``, ``Expand``, ``Tile`` or ``Range`` from
    the values of its inputs, computed without making it (None for other operators or
    inputs of the wrong kind: the evaluator reports those). Python integers: no overflow."""
    def ints(value: np.ndarray) -> "list[int] | None":
        return None if value.dtype.kind not in "iu" else [int(v) for v in value.reshape(-1)]

    if op == "ConstantOfShape" and len(inputs) == 1 and ints(inputs[0]) is not None:
        return math.prod(max(d, 0) for d in ints(inputs[0]))
    if op == "Expand" and len(inputs) == 2 and ints(inputs[1]) is not None:
        dims, shape = ints(inputs[1]), inputs[0].shape
        rank = max(len(dims), len(shape))
        dims = [1] * (rank - len(dims)) + dims
        shape = [1] * (rank - len(shape)) + list(shape)
        return math.prod(max(a, b, 0) for a, b in zip(dims, shape))
    if op == "Tile" and len(inputs) == 2 and ints(inputs[1]) is not None:
        return int(inputs[0].size) * math.prod(max(r, 0) for r in ints(inputs[1]))
    if op == "Range" and len(inputs) == 3 and all(a.size == 1 for a in inputs):
        start, limit, delta = (float(a.reshape(-1)[0]) for a in inputs)
        if not all(math.isfinite(v) for v in (start, limit, delta)) or delta == 0:
            return None
        return max(math.ceil((limit - start) / delta), 0)
    return None


def fold_work(node: onnx.NodeProto, inputs: "list[np.ndarray]",
              static: "list[tuple[int, ...] | None]") -> "int | None":
    """Return the multiply-accumulates (``MatMul``, ``Gemm``, ``Conv``) or window taps
    (pooling) folding ``node`` takes, None for an operator whose work is about its input and
    output sizes (bounded by :func:`output_bound`) or when the output shape is unknown."""
    if node.op_type not in MAX_FOLD_WORK or not static or static[0] is None:
        return None
    out = math.prod(static[0])
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "MatMul":
        return out * (inputs[0].shape[-1] if inputs[0].ndim else 1)
    if node.op_type == "Gemm":
        return out * (inputs[0].shape[0 if attrs.get("transA") else -1] if inputs[0].ndim
                      else 1)
    if node.op_type == "Conv":
        return out * (math.prod(inputs[1].shape[1:]) if len(inputs) > 1 else 1)
    return out * math.prod(attrs.get("kernel_shape", [1]))


class FoldBudget:
    """What the folded results of one model may still hold (:data:`MAX_FOLDED_ELEMENTS`)."""

    def __init__(self, limit: "int | None" = None) -> None:
        self.limit = MAX_FOLDED_ELEMENTS if limit is None else limit
        self.used = 0

    def reserve(self, node: onnx.NodeProto, elements: int) -> None:
        """Check, before ``node`` is evaluated, that results of ``elements`` still fit.

        Raises
        ------
        ResourceError
            Naming the node and both sizes.
        """
        if self.used + elements > self.limit:
            raise ResourceError(f"Cannot fold constant node '{node.name}' ({node.op_type}): its "
                                f"result could have {elements} elements, and the constants "
                                f"folded before it hold {self.used}; hwonnx folds at most "
                                f"{self.limit} elements per model")

    def spend(self, results: "dict[str, np.ndarray]") -> None:
        self.used += sum(int(value.size) for value in results.values())


def evaluate_node(node: onnx.NodeProto, constants: dict, opsets: "dict[str, int]",
                  static: "list[tuple[int, ...] | None] | None" = None,
                  budget: "FoldBudget | None" = None) -> "dict[str, np.ndarray]":
    """Evaluate ``node`` on constant inputs with onnx's reference evaluator.

    Raises
    ------
    ModelError
        If the result could exceed :data:`MAX_TENSOR_ELEMENTS` or the evaluation fails.
    ResourceError
        If folding the node takes more than :data:`MAX_FOLD_WORK`, or its result would bring
        the results folded with ``budget`` beyond :data:`MAX_FOLDED_ELEMENTS`.
    """
    feeds = {value: constants[value] for value in node.input if value}
    inputs = [constants[v] for v in node.input if v]
    bound = output_bound(node, inputs, static or [])
    if bound is None or bound > MAX_TENSOR_ELEMENTS:
        size = "an unknown number of" if bound is None else f"up to {bound}"
        raise ModelError(f"Cannot fold constant node '{node.name}' ({node.op_type}): its result "
                         f"could have {size} elements; hwonnx folds results of at most "
                         f"{MAX_TENSOR_ELEMENTS} elements whose size is known beforehand")
    work = fold_work(node, inputs, static or [])
    if work is not None and work > MAX_FOLD_WORK[node.op_type]:
        unit = "window taps" if "Pool" in node.op_type else "multiply-accumulates"
        raise ResourceError(f"Cannot fold constant node '{node.name}' ({node.op_type}): it "
                            f"takes {work} {unit}; hwonnx folds a {node.op_type} of at most "
                            f"{MAX_FOLD_WORK[node.op_type]}")
    if budget is not None:
        budget.reserve(node, bound * max(1, len([v for v in node.output if v])))
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")          # numpy's on user data (1/0 and the like)
            results = ReferenceEvaluator(node, opsets=opsets).run(None, feeds)
    except Exception as error:                   # any failure of onnx's evaluator on user data
        text = " ".join(str(error).split())
        raise ModelError(f"Cannot fold constant node '{node.name}' ({node.op_type}): "
                         f"{text}") from error
    results = {name: np.asarray(result) for name, result in zip(node.output, results) if name}
    if budget is not None:
        budget.spend(results)
    return results


def fold_constants(model: onnx.ModelProto, types: dict,
                   nodes: "list[onnx.NodeProto] | None" = None
                   ) -> "tuple[list[onnx.NodeProto], dict[str, np.ndarray]]":
    """Fold the constant subgraphs of ``model`` (shape-inferred, support-checked).

    Parameters
    ----------
    model : onnx.ModelProto
        The model after shape inference.
    types : dict
        The value types from :func:`hwonnx.frontend.shapes.value_types`.
    nodes : list of onnx.NodeProto, optional
        The nodes to fold (default: all of the main graph's, in order).

    Returns
    -------
    nodes : list of onnx.NodeProto
        The nodes left to compute at run time, in order.
    constants : dict of str to numpy.ndarray
        Every constant value: initializers and folded node outputs.

    Raises
    ------
    ModelError
        If a constant node cannot be evaluated or a ``Shape`` input has no static shape.
    ResourceError
        If folding breaks :data:`MAX_FOLD_WORK` or :data:`MAX_FOLDED_ELEMENTS`.
    """
    opsets = opset_versions(model)
    constants = {}
    for init in model.graph.initializer:
        try:
            constants[init.name] = numpy_helper.to_array(init)
        except (ValueError, TypeError) as error:     # read.check_tensor makes this rare
            raise ModelError(f"Initializer '{init.name}' cannot be read: {error}") from error
    kept = []
    budget = FoldBudget()
    for node in (model.graph.node if nodes is None else nodes):
        if node.op_type == "Shape":
            constants[node.output[0]] = _shape(node, types)
        elif all(value in constants for value in node.input if value):
            static = [types.get(v, (0, None))[1] for v in node.output if v]
            constants.update(evaluate_node(node, constants, opsets, static, budget))
        else:
            kept.append(node)
    return kept, constants


def release_initializers(model: onnx.ModelProto, nodes: "list[onnx.NodeProto]"
                         ) -> "tuple[onnx.ModelProto, list[onnx.NodeProto]]":
    """Return a copy of ``model`` without its initializers and with ``nodes`` (copied) as its
    nodes, and those copies; once :func:`fold_constants` has made arrays of the initializers,
    dropping every reference to ``model`` (and its nodes) gives the memory of its tensor data
    back (a parsed protobuf frees its memory only as a whole)."""
    copy = onnx.ModelProto()
    copy_fields(model, copy, skip=("graph",))
    copy_fields(model.graph, copy.graph, skip=("initializer", "sparse_initializer", "node"))
    extend_messages(copy.graph.node, nodes)
    return copy, list(copy.graph.node)


def _shape(node: onnx.NodeProto, types: dict) -> np.ndarray:
    shape = types.get(node.input[0], (0, None))[1]
    if shape is None:
        raise ModelError(f"Node '{node.name}' (Shape) reads the shape of '{node.input[0]}', "
                         f"which shape inference could not make static")
    attrs = {a.name: a.i for a in node.attribute}
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return np.array(shape[start:end], dtype=np.int64)


def remove_dead_nodes(nodes: "list[onnx.NodeProto]", outputs: "set[str]"
                      ) -> "list[onnx.NodeProto]":
    """Drop nodes none of whose outputs reach a graph output."""
    live = set(outputs)
    kept = []
    for node in reversed(nodes):
        if any(value in live for value in node.output):
            kept.append(node)
            live.update(node.input)
    return kept[::-1]
