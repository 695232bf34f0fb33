"""Helpers shared by the frontend modules: opset lookup, element types and value definitions."""

import onnx

__all__ = [
    "DEFAULT_DOMAINS", "FLOAT_TYPES", "elem_type_name", "is_default_domain", "opset_versions",
    "domain_opset", "definitions",
]

DEFAULT_DOMAINS = ("", "ai.onnx")

FLOAT_TYPES = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.DOUBLE: "float64",
}


def elem_type_name(elem_type: int) -> str:
    """Return a readable name (``"float32"``, ``"int64"``) for an ONNX element type."""
    if elem_type in FLOAT_TYPES:
        return FLOAT_TYPES[elem_type]
    if elem_type in onnx.TensorProto.DataType.values():
        return onnx.TensorProto.DataType.Name(elem_type).lower()
    return f"element type {elem_type}"


def is_default_domain(domain: str) -> bool:
    return domain in DEFAULT_DOMAINS


def opset_versions(model: onnx.ModelProto) -> "dict[str, int]":
    """Map each imported domain to its version; ``'ai.onnx'`` is folded into ``''``."""
    return {("" if is_default_domain(o.domain) else o.domain): int(o.version)
            for o in model.opset_import}


def domain_opset(model: onnx.ModelProto, domain: str) -> int:
    """Return the imported version of ``domain``, or 0 when the model does not import it."""
    return opset_versions(model).get("" if is_default_domain(domain) else domain, 0)


def definitions(graph: onnx.GraphProto) -> "dict[str, str]":
    """Map every value defined without a node (graph inputs, initializers) to its kind."""
    defined = {init.name: "initializer" for init in graph.initializer}
    for value in graph.input:
        defined[value.name] = "graph input"
    return defined
