"""Constant folding: evaluate every node whose inputs are constants, and ``Shape`` of any value
whose shape is static, so that only compute nodes reach the converter."""

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from ..errors import ModelError
from .common import opset_versions

__all__ = ["fold_constants", "remove_dead_nodes"]


def fold_constants(model: onnx.ModelProto, types: dict
                   ) -> "tuple[list[onnx.NodeProto], dict[str, np.ndarray]]":
    """Fold the constant subgraphs of ``model`` (shape-inferred, support-checked).

    Parameters
    ----------
    model : onnx.ModelProto
        The model after shape inference.
    types : dict
        The value types from :func:`hwonnx.frontend.shapes.value_types`.

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
    """
    opsets = opset_versions(model)
    constants = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    kept = []
    for node in model.graph.node:
        if node.op_type == "Shape":
            constants[node.output[0]] = _shape(node, types)
        elif all(value in constants for value in node.input if value):
            constants.update(_evaluate(node, constants, opsets))
        else:
            kept.append(node)
    return kept, constants


def _shape(node: onnx.NodeProto, types: dict) -> np.ndarray:
    shape = types.get(node.input[0], (0, None))[1]
    if shape is None:
        raise ModelError(f"Node '{node.name}' (Shape) reads the shape of '{node.input[0]}', "
                         f"which shape inference could not make static")
    attrs = {a.name: a.i for a in node.attribute}
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return np.array(shape[start:end], dtype=np.int64)


def _evaluate(node: onnx.NodeProto, constants: dict, opsets: dict) -> "dict[str, np.ndarray]":
    feeds = {value: constants[value] for value in node.input if value}
    try:
        results = ReferenceEvaluator(node, opsets=opsets).run(None, feeds)
    except Exception as error:                   # any failure of onnx's evaluator on user data
        text = " ".join(str(error).split())
        raise ModelError(f"Cannot fold constant node '{node.name}' ({node.op_type}): "
                         f"{text}") from error
    return {name: np.asarray(result) for name, result in zip(node.output, results) if name}


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
