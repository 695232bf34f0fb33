"""The support check: runs before shape inference and folding, so that a user who asks for an
unsupported operator gets one error listing every such node, not an onnx traceback."""

import onnx

from ..errors import UnsupportedOperatorError
from ..ir.graph import Graph
from ..ir.ops import ONNX_OPS, onnx_ops
from .common import LISTED_NODES, domain_opset, is_default_domain, summary
from .host import (HOST_END_OPS, HOST_MIDDLE_OPS, HOST_ONLY_OPS, HOST_START_OPS, at_end,
                   end_values,
                   leading_chain, runs_on_neither)

__all__ = ["COMPUTE_OPS", "FOLDABLE_OPS", "constant_values", "check_support",
           "check_fused", "summary", "LISTED_NODES"]


#: Operators mapped onto the float IR vocabulary (the registry's ``compute`` entries: the table
#: operators too). (The operators without a hardware mapping that the host runs at the start or
#: end of the graph are :data:`.host.HOST_ONLY_OPS`.)
COMPUTE_OPS = onnx_ops(compute=True)
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
FOLDABLE_OPS = onnx_ops(foldable=True)
_CONTROL_FLOW = frozenset({"Loop", "Scan", "SequenceMap"})
# Inputs (by position) of compute operators that must be constants.
_CONSTANT_INPUTS = {op: entry.constant_inputs for op, entry in ONNX_OPS.items()
                    if entry.constant_inputs}


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


def check_support(model: onnx.ModelProto, fused: "frozenset[str]" = frozenset()) -> None:
    """Raise one :class:`UnsupportedOperatorError` listing every node hwonnx cannot map.

    Parameters
    ----------
    model : onnx.ModelProto
        A validated model with every node named.
    fused : frozenset of str
        Nodes inside a recognised unary pattern (:mod:`.patterns`), which become one table
        operator: not checked on their own.

    Raises
    ------
    UnsupportedOperatorError
        If any node is in a domain other than ``ai.onnx``, is not a supported operator, is a
        foldable operator on a run-time value, or has a run-time value where a constant is
        needed (convolution weights, ``MatMul`` second operand, ``Clip`` bounds, ...), or is
        an operator without a hardware mapping (``Sub``, ``Softmax``, ``ArgMax``, ...) that
        is not where the host can run it: ``Sub``, ``Div`` and ``Cast`` in the leading chain
        on a graph input, ``Softmax``, ``LogSoftmax``, ``ArgMax`` and ``TopK`` at the end
        of the graph (:mod:`.host`).
    """
    graph = model.graph
    constant = constant_values(graph)
    start = {node.name for node in leading_chain(graph.node, [v.name for v in graph.input],
                                                  {v.name for v in graph.output}, constant)}
    end = end_values(graph.node)
    nodes, reasons = [], []
    for node in graph.node:
        if node.name in fused:
            continue
        if is_default_domain(node.domain) and node.op_type in HOST_ONLY_OPS \
                and not _between_computed(node, constant):
            here = (node.op_type in HOST_START_OPS and node.name in start) or \
                (node.op_type in HOST_END_OPS and at_end(node, end)) or \
                node.op_type in HOST_MIDDLE_OPS or \
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
                      f"start of the graph, {', '.join(sorted(HOST_ONLY_OPS & HOST_END_OPS))} "
                      f"at the end and {', '.join(sorted(HOST_MIDDLE_OPS))} between "
                      f"accelerator segments",)
        raise error


def _between_computed(node: onnx.NodeProto, constant: "set[str]") -> bool:
    """Whether ``node`` is a ``Sub`` of two computed tensors (the element-wise engine's, not a
    host step)."""
    return node.op_type == "Sub" and len(node.input) == 2 \
        and not any(v in constant for v in node.input)


def _reason(node: onnx.NodeProto, constant: "set[str]") -> "str | None":
    """Return None when ``node`` is supported, else an explanation ('' if none is needed)."""
    if not is_default_domain(node.domain):
        return ""
    if _between_computed(node, constant):
        return None
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
        if mode not in ("constant", "reflect", "edge", "wrap"):
            return (f"Pad '{node.name}' has mode '{mode}'; ONNX defines 'constant' (folded "
                    f"into the padding of the Conv, AveragePool or MaxPool reading it), "
                    f"'reflect', 'edge' and 'wrap' (copies of rows and columns)")
    for index, role in _CONSTANT_INPUTS.get(node.op_type, {}).items():
        if index < len(node.input) and node.input[index] and node.input[index] not in constant:
            return (f"{node.op_type} '{node.name}' needs a constant {role}, but "
                    f"'{node.input[index]}' is computed at run time")
    return None


def check_fused(graph: Graph, opset: int) -> None:
    """Raise one :class:`UnsupportedOperatorError` naming every ``Clip`` the float pipeline
    could not fuse into the layer before it, every ``Pad`` it could not fold into the
    padding of the layers after it and every ``Permute`` of other than four axes (a channel
    shuffle's Transpose that ``channel-shuffle`` did not replace); ``opset``: the model's
    ai.onnx opset, for the message. Runs after :data:`hwonnx.passes.FLOAT_PIPELINE`."""
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
        if node.op == "Permute" and len(node.attrs["perm"]) != 4:
            # the converter let it through as a channel shuffle's Transpose, but the
            # channel-shuffle pass did not find the shuffle (a check that disagrees: a bug)
            shape = list(graph.types[node.inputs[0]].shape)
            nodes.append((node.name, "Transpose", "", opset))
            reasons.append(f"Transpose '{node.name}' has perm {list(node.attrs['perm'])} on a "
                           f"value of shape {shape}; the array moves the channel, height and "
                           f"width axes of a [1, C, H, W] image")
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
