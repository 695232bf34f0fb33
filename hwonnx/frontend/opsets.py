"""Operator signatures and opset versions: every node is checked against its operator's schema
at the version the model imports, then models older than :data:`MIN_OPSET` are brought to it
with onnx's version converter (newer ones are read as they are, up to the newest opset the
installed onnx knows)."""

from typing import Iterable

import onnx
import onnx.version_converter

from ..errors import ModelError
from .common import (
    ReadLog,
    domain_opset,
    graph_attributes,
    is_default_domain,
    opset_versions,
    outer_references,
)
from .graph_rules import name_nodes
from .shapes import put_back_initializers, shape_skeleton
from .validate import newest_opsets

__all__ = ["MIN_OPSET", "check_signatures", "convert_opset"]

#: The oldest ai.onnx opset the converters of :mod:`.convert` are written for.
MIN_OPSET = 13


def check_signatures(model: onnx.ModelProto,
                     nodes: "Iterable[onnx.NodeProto] | None" = None) -> None:
    """Check each node of a domain onnx knows against its operator's signature (number of
    inputs and outputs, attribute names and types, the graphs it holds), with onnx's node
    checker.

    Parameters
    ----------
    model : onnx.ModelProto
        The model (its IR version and operator sets).
    nodes : iterable of onnx.NodeProto, optional
        The nodes to check (default: every node of the main graph). The loader checks the
        nodes no output depends on before it drops them, the others after the support check.

    Raises
    ------
    ModelError
        Naming the node, the operator version and onnx's reason.
    """
    opsets = opset_versions(model)
    context = onnx.checker.C.CheckerContext()
    context.ir_version = max(int(model.ir_version), 3)
    known = newest_opsets()
    # every imported domain (nested graphs may call operators of domains onnx does not know;
    # only their presence matters, not their version)
    context.opset_imports = {d: v if d in known else 1 for d, v in opsets.items()}
    for node in (model.graph.node if nodes is None else nodes):
        domain = "" if is_default_domain(node.domain) else node.domain
        if domain not in known:
            continue
        try:
            onnx.checker.check_node(_scoped(node), context)
        except (onnx.checker.ValidationError, RuntimeError) as error:
            text = str(error).strip().split("\n")[0].strip()
            raise ModelError(f"Node '{node.name}' does not fit the signature of {node.op_type} "
                             f"in {domain or 'ai.onnx'} opset {opsets[domain]}: {text} (ONNX "
                             f"IR: a node's inputs, outputs and attributes MUST satisfy its "
                             f"operator's signature)") from error


def _scoped(node: onnx.NodeProto) -> onnx.NodeProto:
    """Return ``node``, or for a node holding graphs a copy whose graphs define the names they
    read from the outer scope (as empty initializers): onnx's node checker is given no outer
    scope, and would take those names for undefined ones."""
    if not any(True for _ in graph_attributes(node)):
        return node
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    for _, graph in graph_attributes(copy):
        for name in sorted(outer_references(graph)):
            graph.initializer.add(name=name, data_type=onnx.TensorProto.FLOAT, dims=[0])
    return copy


def convert_opset(model: onnx.ModelProto, rlog: ReadLog) -> onnx.ModelProto:
    """Return ``model`` converted to ai.onnx opset :data:`MIN_OPSET` if it imports an older
    one (with a note), else ``model`` itself. The converter is given the model without its
    large initializers (as typed inputs; no conversion reads their values), which are put back
    afterwards: it copies what it is given several times.

    Raises
    ------
    ModelError
        If onnx's version converter cannot convert the model.
    """
    version = domain_opset(model, "")
    if version >= MIN_OPSET:
        return model
    ir_version = model.ir_version
    model.ir_version = max(ir_version, 4)   # before IR 4, initializers had to be inputs too
    try:
        if version < 7:
            _align_legacy_broadcast(model, rlog)
        skeleton, moved = shape_skeleton(model)
        converted = _convert(skeleton, version)
    finally:
        model.ir_version = ir_version
    put_back_initializers(converted, model, moved)
    converted.ir_version = ir_version
    name_nodes(converted.graph.node)
    rlog.note(f"Converted ai.onnx opset {version} to {MIN_OPSET} with onnx's version converter")
    return converted


_BROADCASTING = ("Add", "Sub", "Mul", "Div")


def _align_legacy_broadcast(model: onnx.ModelProto, rlog: ReadLog) -> None:
    """Before opset 7, ``broadcast=1`` with ``axis`` aligned B with A from ``axis`` on; onnx's
    converter gets that wrong unless B is a suffix of A, so give a constant B trailing
    dimensions of size 1 here (numpy broadcasting then means the same), in place."""
    ranks = {}
    for value in (*_with_shapes(model).graph.value_info, *model.graph.input):
        if value.type.tensor_type.HasField("shape"):
            ranks[value.name] = len(value.type.tensor_type.shape.dim)
    inits = {init.name: init for init in model.graph.initializer}
    for node in model.graph.node:
        attrs = {a.name: a for a in node.attribute}
        if node.op_type not in _BROADCASTING or not is_default_domain(node.domain) or \
                "axis" not in attrs or len(node.input) != 2:
            continue
        a, b = node.input
        rank_a = ranks.get(a)
        if b not in inits or rank_a is None:
            raise ModelError(f"Node '{node.name}' ({node.op_type}, opset < 7) broadcasts "
                             f"'{b}' along axis {attrs['axis'].i}, which hwonnx converts only "
                             f"for a constant '{b}' and an input of known rank; re-export the "
                             f"model with opset 7 or newer")
        axis = attrs["axis"].i + (rank_a if attrs["axis"].i < 0 else 0)
        trailing = rank_a - axis - len(inits[b].dims)
        if trailing < 0:
            raise ModelError(f"Node '{node.name}' ({node.op_type}) broadcasts '{b}' of rank "
                             f"{len(inits[b].dims)} from axis {axis} of a rank-{rank_a} input")
        aligned = onnx.TensorProto()
        aligned.CopyFrom(inits[b])
        aligned.name = f"{b}_aligned_{node.name}"
        aligned.dims.extend([1] * trailing)
        model.graph.initializer.append(aligned)
        node.input[1] = aligned.name
        node.attribute.remove(attrs["axis"])
        rlog.note(f"Aligned '{b}' of {node.op_type} '{node.name}' for numpy broadcasting "
                  f"(legacy axis={attrs['axis'].i})")


def _convert(model: onnx.ModelProto, version: int) -> onnx.ModelProto:
    try:
        return onnx.version_converter.convert_version(_with_shapes(model), MIN_OPSET)
    except Exception:               # onnx's C++ converter; retry one version at a time
        pass
    current = model
    for target in range(version + 1, MIN_OPSET + 1):
        try:
            current = onnx.version_converter.convert_version(_with_shapes(current), target)
        except Exception as error:
            text = " ".join(str(error).split())
            text = text.split("Assertion ")[-1]
            raise ModelError(f"Cannot convert the model from ai.onnx opset {target - 1} to "
                             f"{target} with onnx's version converter ({text}); re-export it "
                             f"with opset {MIN_OPSET} or newer") from error
    return current


def _with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return ``model`` with inferred value_info (some adapters need input shapes)."""
    try:
        return onnx.shape_inference.infer_shapes(model)
    except Exception:                 # conversion reports its own, clearer, error
        return model
