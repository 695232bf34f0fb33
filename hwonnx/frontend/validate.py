"""Check a model against the rules of the ONNX IR specification that hwonnx relies on."""

import onnx

from ..errors import ModelError
from .common import FLOAT_TYPES, definitions, elem_type_name, is_default_domain

__all__ = ["name_nodes", "validate_model"]


def name_nodes(model: onnx.ModelProto) -> None:
    """Give every unnamed node of ``model`` (a private copy) the name ``<op_type>_<index>``."""
    for index, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{index}"


def validate_model(model: onnx.ModelProto) -> None:
    """Check versions, operator set imports, graph signature, SSA and topological order.

    Parameters
    ----------
    model : onnx.ModelProto
        The model, with every node named (see :func:`name_nodes`).

    Raises
    ------
    ModelError
        If the model breaks a rule; the message names the rule and the node or value.
    """
    _check_versions(model)
    graph = model.graph
    initialized = {init.name for init in graph.initializer}
    for value in graph.input:
        # An initialized input is a constant for hwonnx, whatever its element type.
        _check_signature(value, "input" if value.name not in initialized else "constant")
    for value in graph.output:
        _check_signature(value, "output")
    _check_definitions(graph)


def _check_versions(model: onnx.ModelProto) -> None:
    version = model.ir_version
    if not model.HasField("ir_version") or version == 0:
        raise ModelError("Model must set ir_version (ONNX IR: every ModelProto names the IR "
                         "version it follows)")
    if version < 3:
        raise ModelError(f"Model ir_version must be at least 3, not {version}; re-export the "
                         f"model with a newer exporter")
    if version > onnx.IR_VERSION:
        raise ModelError(f"Model ir_version {version} is newer than {onnx.IR_VERSION}, the newest "
                         f"version onnx {onnx.__version__} reads; upgrade onnx or re-export the "
                         f"model with ir_version {onnx.IR_VERSION} or older")
    if not model.opset_import:
        raise ModelError("Model must have an opset_import (ONNX IR: a model names every "
                         "operator set it uses)")
    seen = set()
    for opset in model.opset_import:
        domain = "" if is_default_domain(opset.domain) else opset.domain
        if domain in seen:
            raise ModelError(f"Model opset_import imports domain '{domain or 'ai.onnx'}' twice "
                             f"(ONNX IR: operator set domains must be unique)")
        seen.add(domain)
    if "" not in seen:
        raise ModelError(f"Model opset_import must import the default domain 'ai.onnx', not "
                         f"only {', '.join(repr(d) for d in sorted(seen))}")


def _check_signature(value: onnx.ValueInfoProto, kind: str) -> None:
    role = "output" if kind == "output" else "input"
    which = value.type.WhichOneof("value")
    if which != "tensor_type":
        raise ModelError(f"Graph {role} '{value.name}' must have a tensor type, not "
                         f"{which or 'no type'}")
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        raise ModelError(f"Graph {role} '{value.name}' must have a shape (ONNX IR: main graph "
                         f"inputs and outputs declare at least their rank)")
    if kind == "input" and tensor.elem_type not in FLOAT_TYPES:
        raise ModelError(f"Graph input '{value.name}' must be float32, float16 or float64, not "
                         f"{elem_type_name(tensor.elem_type)}")


def _check_definitions(graph: onnx.GraphProto) -> None:
    where: "dict[str, str]" = {}

    def define(value: str, site: str) -> None:
        if value in where:
            raise ModelError(f"Value '{value}' is defined twice, by {where[value]} and by "
                             f"{site} (ONNX IR: single static assignment)")
        where[value] = site

    inputs = {value.name for value in graph.input}
    for value in graph.input:
        define(value.name, "a graph input")
    for init in graph.initializer:
        if init.name not in inputs:
            define(init.name, "an initializer")
    for node in graph.node:
        for value in node.output:
            if value:
                define(value, f"node '{node.name}'")
    defined = set(definitions(graph))
    for node in graph.node:
        for value in node.input:
            if not value or value in defined:
                continue
            if value in where:
                raise ModelError(f"Node '{node.name}' reads '{value}' before {where[value]} "
                                 f"defines it (ONNX IR: nodes must be in topological order)")
            raise ModelError(f"Node '{node.name}' reads '{value}', which is not a graph input, "
                             f"an initializer or a node output")
        defined.update(value for value in node.output if value)
    for value in graph.output:
        if value.name not in defined:
            raise ModelError(f"Graph output '{value.name}' is never produced (ONNX IR: every "
                             f"graph output must be defined)")
