"""The support check: runs before shape inference and folding, so that a user who asks for an
unsupported operator gets one error listing every such node, not an onnx traceback."""

import onnx

from ..errors import UnsupportedOperatorError
from ..ir.graph import Graph
from ..ir.tables import TABLE_OPS
from .common import domain_opset, is_default_domain
from .host import (HOST_END_OPS, HOST_ONLY_OPS, HOST_START_OPS, at_end, end_values,
                   leading_chain, runs_on_neither)

__all__ = ["COMPUTE_OPS", "FOLDABLE_OPS", "constant_values", "check_support",
           "check_fused", "summary", "LISTED_NODES"]

#: Up to this many unsupported nodes are listed one by one; more are summarized by operator,
#: with the first few node names and reasons (``error.nodes`` still lists them all).
LISTED_NODES = 10
_NAMES_PER_OPERATOR = 3
_OPERATORS = 20
_REASONS = 3

#: Operators mapped onto the float IR vocabulary. (The operators without a hardware mapping
#: that the host runs at the start or end of the graph are :data:`.host.HOST_ONLY_OPS`.)
COMPUTE_OPS = frozenset({
    "Gemm", "MatMul", "Add", "Conv", "Relu", "Flatten", "Reshape", "BatchNormalization",
    "Identity", "Dropout", "AveragePool", "GlobalAveragePool", "Clip", "Mul", "Pad",
    "Squeeze", "Unsqueeze", "Transpose", "Concat", "MaxPool", "GlobalMaxPool",
    "Max", "Min", "Sum", "Mean",
}) | frozenset(TABLE_OPS)          # the table operators (LeakyRelu, Sigmoid, Elu, Gelu, ...)
#: The ONNX operators of the layer-like float IR ops (``Conv``, ``Dense``, ``Add``,
#: ``AvgPool``, ``MaxPool``, ``Concat``) a ``Clip`` can be fused into by the ``fuse-clip`` pass.
_LAYER_SOURCES = ("Conv, Gemm, MatMul, Add, Concat, AveragePool, GlobalAveragePool, MaxPool or "
                  "GlobalMaxPool")
#: (A run-time ``Mul`` by a per-channel constant and a standalone ``BatchNormalization`` become
#: ``Conv`` or ``Dense`` too, so a ``Clip`` after them is fused as well.)
#: Operators accepted only on constant inputs; constant folding removes them. (``Mul``,
#: ``Squeeze``, ``Unsqueeze`` and ``Concat`` are compute operators: folded on constants, mapped
#: on run-time values; ``Cast``, ``Div`` and ``Sub`` on run-time values are host steps at the
#: start of the graph.)
FOLDABLE_OPS = frozenset({
    "Constant", "Shape", "Gather", "Cast", "Slice", "Div", "Sub",
})
_CONTROL_FLOW = frozenset({"Loop", "Scan", "SequenceMap"})
# Inputs (by position) of compute operators that must be constants.
_CONSTANT_INPUTS = {
    "Conv": {1: "weight", 2: "bias"},
    "Gemm": {1: "B", 2: "C"},
    "MatMul": {1: "second operand"},
    "BatchNormalization": {1: "scale", 2: "B", 3: "input_mean", 4: "input_var"},
    "Reshape": {1: "shape"},
    "Clip": {1: "min", 2: "max"},
    "Pad": {1: "pads", 2: "constant_value", 3: "axes"},
    "Squeeze": {1: "axes"},
    "Unsqueeze": {1: "axes"},
}


def constant_values(graph: onnx.GraphProto) -> "set[str]":
    """Return the values computed only from constants or from ``Shape`` of a value.

    Initializers (including those that are also graph inputs, whose defaults hwonnx uses) and
    outputs of ``Constant`` and ``Shape`` nodes are constant; so is every output of a node
    whose inputs are all constant.
    """
    constant = {init.name for init in graph.initializer}
    for node in graph.node:
        if is_default_domain(node.domain) and (
                node.op_type == "Shape" or all(v in constant for v in node.input if v)):
            constant.update(value for value in node.output if value)
    return constant


def check_support(model: onnx.ModelProto) -> None:
    """Raise one :class:`UnsupportedOperatorError` listing every node hwonnx cannot map.

    Parameters
    ----------
    model : onnx.ModelProto
        A validated model with every node named.

    Raises
    ------
    UnsupportedOperatorError
        If any node is in a domain other than ``ai.onnx``, is not a supported operator, is a
        foldable operator on a run-time value, or has a run-time value where a constant is
        needed (convolution weights, ``MatMul`` second operand, ``Clip`` bounds, ...), or is
        an operator without a hardware mapping (``Sub``, ``Softmax``, ``ArgMax``, ...) that
        is not where the host can run it: ``Sub``, ``Div`` and ``Cast`` in the leading chain
        on the graph input, ``Softmax``, ``LogSoftmax``, ``ArgMax`` and ``TopK`` at the end
        of the graph (:mod:`.host`).
    """
    graph = model.graph
    constant = constant_values(graph)
    start = {node.name for node in leading_chain(graph.node, [v.name for v in graph.input],
                                                  {v.name for v in graph.output}, constant)}
    end = end_values(graph.node)
    nodes, reasons = [], []
    for node in graph.node:
        if is_default_domain(node.domain) and node.op_type in HOST_ONLY_OPS \
                and not _between_computed(node, constant):
            here = (node.op_type in HOST_START_OPS and node.name in start) or \
                (node.op_type in HOST_END_OPS and at_end(node, end)) or \
                all(v in constant for v in node.input if v)            # folded
            reason = None if here else runs_on_neither(node.name, node.op_type)
            if here and node.op_type == "TopK" and len(node.input) > 1 \
                    and node.input[1] not in constant:      # (no K: the signature check)
                reason = (f"TopK '{node.name}' needs a constant K, but '{node.input[1]}' is "
                          f"computed at run time")
        else:
            reason = _reason(node, constant)
        if reason is not None:
            nodes.append((node.name, node.op_type, node.domain,
                          domain_opset(model, node.domain)))
            if reason:
                reasons.append(reason)
    if nodes:
        error = UnsupportedOperatorError(nodes)
        supported = ", ".join(sorted(COMPUTE_OPS))
        error.args = (f"{summary(error, reasons)}; supported operators are {supported}; on the "
                      f"host also {', '.join(sorted(HOST_ONLY_OPS & HOST_START_OPS))} at the "
                      f"start of the graph and {', '.join(sorted(HOST_ONLY_OPS & HOST_END_OPS))} "
                      f"at the end",)
        raise error


def summary(error: UnsupportedOperatorError, reasons: "list[str]") -> str:
    """Return the message of ``error`` with ``reasons`` (in parentheses): every node when
    there are at most :data:`LISTED_NODES`, else a summary by operator, so that a model with
    thousands of unsupported nodes still gets a short line."""
    if len(error.nodes) <= LISTED_NODES:
        return f"{error}" + (f" ({'; '.join(reasons)})" if reasons else "")
    groups: "dict[tuple[str, str, int], list[str]]" = {}
    for name, op, domain, opset in error.nodes:
        groups.setdefault((op, domain, opset), []).append(name)
    parts = []
    for (op, domain, opset), names in list(groups.items())[:_OPERATORS]:
        shown = ", ".join(f"'{name}'" for name in names[:_NAMES_PER_OPERATOR])
        more = f" and {len(names) - _NAMES_PER_OPERATOR} more" \
            if len(names) > _NAMES_PER_OPERATOR else ""
        parts.append(f"{op} (domain '{domain or 'ai.onnx'}', opset {opset}) x{len(names)}: "
                     f"nodes {shown}{more}")
    if len(groups) > _OPERATORS:
        parts.append(f"and {len(groups) - _OPERATORS} more operators")
    text = f"{len(error.nodes)} unsupported node(s), by operator: {'; '.join(parts)}"
    if reasons:
        more = f"; and {len(reasons) - _REASONS} more" if len(reasons) > _REASONS else ""
        text += f" ({'; '.join(reasons[:_REASONS])}{more})"
    return text


def _between_computed(node: onnx.NodeProto, constant: "set[str]") -> bool:
    """Whether ``node`` is a ``Sub`` or ``Div`` of two computed tensors (not a host step)."""
    return node.op_type in ("Sub", "Div") and len(node.input) == 2 \
        and not any(v in constant for v in node.input)


def _reason(node: onnx.NodeProto, constant: "set[str]") -> "str | None":
    """Return None when ``node`` is supported, else an explanation ('' if none is needed)."""
    if not is_default_domain(node.domain):
        return ""
    if _between_computed(node, constant):
        return None if node.op_type == "Sub" else (
            f"Div '{node.name}' divides '{node.input[0]}' by '{node.input[1]}', both computed "
            f"at run time; a quotient of two int8 tensors has no exact integer formulation on "
            f"the element-wise engine (it maps Add, Sub, Mul, Max, Min, Sum and Mean)")
    if node.op_type == "If":
        return (f"If '{node.name}' has condition '{node.input[0] if node.input else ''}', "
                f"which is not a constant hwonnx can fold; an If is read only when its "
                f"condition is constant, and is replaced by the branch it selects")
    if node.op_type in _CONTROL_FLOW or any(a.HasField("g") or a.graphs
                                             for a in node.attribute):
        return f"{node.op_type} '{node.name}' is control flow, which hwonnx does not support"
    inputs_constant = all(value in constant for value in node.input if value)
    if node.op_type in FOLDABLE_OPS:
        if node.op_type in ("Constant", "Shape") or inputs_constant:
            return None
        runtime = next(v for v in node.input if v and v not in constant)
        return (f"{node.op_type} '{node.name}' is folded away, so its inputs must be "
                f"constants, but '{runtime}' is computed at run time")
    if node.op_type not in COMPUTE_OPS:
        return ""
    if inputs_constant:
        return None                                  # folded away like any constant subgraph
    if node.op_type == "Pad":
        mode = next((onnx.helper.get_attribute_value(a) for a in node.attribute
                     if a.name == "mode"), b"constant")
        mode = mode.decode(errors="replace") if isinstance(mode, bytes) else str(mode)
        if mode != "constant":
            return (f"Pad '{node.name}' has mode '{mode}'; only mode 'constant' (folded into "
                    f"the padding of the Conv, AveragePool or MaxPool reading it) is "
                    f"supported")
    for index, role in _CONSTANT_INPUTS.get(node.op_type, {}).items():
        if index < len(node.input) and node.input[index] and node.input[index] not in constant:
            return (f"{node.op_type} '{node.name}' needs a constant {role}, but "
                    f"'{node.input[index]}' is computed at run time")
    return None


def check_fused(graph: Graph, opset: int) -> None:
    """Raise one :class:`UnsupportedOperatorError` naming every ``Clip`` the float pipeline
    could not fuse into the layer before it and every ``Pad`` it could not fold into the
    padding of the layers after it (``opset``: the model's ai.onnx opset, for the message).
    Runs after :data:`hwonnx.passes.FLOAT_PIPELINE`."""
    nodes, reasons = [], []
    for node in graph.nodes:
        if node.op == "Pad":
            nodes.append((node.name, "Pad", "", opset))
            reasons.append(f"Pad '{node.name}' is not read only by Conv, MaxPool or "
                           f"AveragePool nodes (with count_include_pad=1 or no padding of "
                           f"their own) whose padding can absorb it (a padding of their own "
                           f"must have the same value), so it cannot be folded; hwonnx pads "
                           f"only inside a convolution or pooling window")
            continue
        if node.op != "Clip":
            continue
        nodes.append((node.name, "Clip", "", opset))
        low = node.attrs["min"]
        if low is not None and low != 0:
            reasons.append(f"Clip '{node.name}' has min={low:g}; only min 0 (a ReLU) or no "
                           f"minimum can be fused into the layer before it")
        else:
            reasons.append(f"Clip '{node.name}' does not follow a {_LAYER_SOURCES} whose output "
                           f"only it reads, so it cannot be fused")
    if nodes:
        error = UnsupportedOperatorError(nodes)
        error.args = (summary(error, reasons),)
        raise error
