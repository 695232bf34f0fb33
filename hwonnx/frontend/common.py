"""Helpers shared by the frontend modules: opset lookup, element types, size limits, tensor
and subgraph walks, and the log of notes and warnings that travels into ``Graph.meta``."""

import logging
import math
import re
from typing import Iterator

import onnx

from ..errors import UnsupportedOperatorError

__all__ = [
    "DEFAULT_DOMAINS", "FLOAT_TYPES", "READ_TYPES", "MAX_TENSOR_ELEMENTS", "MAX_TENSOR_BYTES",
    "MAX_RANK",
    "ReadLog", "elem_type_name", "is_default_domain", "opset_versions", "domain_opset",
    "is_c_identifier", "dims_size", "count_text", "dims_text", "copy_fields", "extend_messages",
    "all_tensors", "LISTED_NODES", "summary", "fresh_name",
    "subgraphs", "outer_references", "graph_attributes",
]

log = logging.getLogger("hwonnx.frontend")

DEFAULT_DOMAINS = ("", "ai.onnx")

P = onnx.TensorProto
FLOAT_TYPES = {
    P.FLOAT: "float32",
    P.FLOAT16: "float16",
    P.DOUBLE: "float64",
    P.BFLOAT16: "bfloat16",
}
#: Element types hwonnx reads; bytes per element.
READ_TYPES = {
    P.FLOAT: 4, P.FLOAT16: 2, P.DOUBLE: 8, P.BFLOAT16: 2, P.BOOL: 1,
    P.INT8: 1, P.INT16: 2, P.INT32: 4, P.INT64: 8,
    P.UINT8: 1, P.UINT16: 2, P.UINT32: 4, P.UINT64: 8,
}
#: No tensor (constant or value) may have more elements than this: 1 GiB of float32.
MAX_TENSOR_ELEMENTS = 1 << 28
MAX_TENSOR_BYTES = 1 << 30
#: No tensor may have more axes than this: numpy's limit (``numpy.ndarray`` refuses more).
MAX_RANK = 64

_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ReadLog:
    """Notes (what the frontend changed: conversions, ignored parts) and warnings (spec
    deviations it tolerated), in the order they were made; each text is kept once."""

    def __init__(self) -> None:
        self.notes: "list[str]" = []
        self.warnings: "list[str]" = []
        self._seen: "set[tuple[str, str]]" = set()

    def note(self, text: str) -> None:
        if ("note", text) not in self._seen:
            self._seen.add(("note", text))
            self.notes.append(text)

    def warn(self, text: str) -> None:
        if ("warn", text) not in self._seen:
            self._seen.add(("warn", text))
            log.warning("%s", text)
            self.warnings.append(text)


def elem_type_name(elem_type: int) -> str:
    """Return a readable name (``"float32"``, ``"int64"``) for an ONNX element type."""
    if elem_type in FLOAT_TYPES:
        return FLOAT_TYPES[elem_type]
    if elem_type == P.UNDEFINED:
        return "no element type"
    if elem_type in P.DataType.values():
        return P.DataType.Name(elem_type).lower()
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


def is_c_identifier(name: str) -> bool:
    return _C_IDENTIFIER.fullmatch(name) is not None


def dims_size(dims) -> int:
    return math.prod(int(d) for d in dims)


def count_text(count: int) -> str:
    """Return ``count`` in decimal, or ``about 10^N`` when it has more than 30 digits (Python
    refuses to print integers of more than 4300 digits, which a product of dims can reach)."""
    if count < 10 ** 30:
        return str(count)
    return f"about 10^{int(math.log10(count))}"


def dims_text(dims, shown: int = 8) -> str:
    """Return ``dims`` as a list, at most ``shown`` of them followed by the number given."""
    dims = [int(d) for d in dims]
    if len(dims) <= shown:
        return str(dims)
    return f"[{', '.join(map(str, dims[:shown]))}, ...] ({len(dims)} dims)"


def extend_messages(target, messages) -> None:
    """Append copies of ``messages`` to the repeated message field ``target`` one by one
    (``extend`` also makes a serialized copy of each on the way, briefly doubling a tensor)."""
    for message in messages:
        target.add().CopyFrom(message)


def copy_fields(source, target, skip: "tuple[str, ...]" = ()) -> None:
    """Copy every field set in the protobuf ``source`` but those named in ``skip`` into
    ``target`` (of the same type), one by one."""
    for field, value in source.ListFields():
        if field.name in skip:
            continue
        if field.is_repeated and field.type == field.TYPE_MESSAGE:
            extend_messages(getattr(target, field.name), value)
        elif field.is_repeated:
            getattr(target, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def graph_attributes(node: onnx.NodeProto) -> "Iterator[tuple[str, onnx.GraphProto]]":
    """Yield ``(attribute name, graph)`` for every graph held by ``node``'s attributes."""
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.name, attr.g
        for graph in attr.graphs:
            yield attr.name, graph


def subgraphs(graph: onnx.GraphProto) -> "Iterator[onnx.GraphProto]":
    """Yield ``graph`` and every graph nested in it, depth first."""
    stack = [graph]
    while stack:
        current = stack.pop()
        yield current
        for node in current.node:
            stack.extend(g for _, g in graph_attributes(node))


def all_tensors(model: onnx.ModelProto) -> "Iterator[tuple[str, onnx.TensorProto]]":
    """Yield ``(description, tensor)`` for every tensor stored in ``model``: initializers,
    sparse initializers and tensor attributes, in the main graph, nested graphs and
    model-local functions."""
    def from_nodes(nodes, where: str):
        for node in nodes:
            for attr in node.attribute:
                label = f"attribute '{attr.name}' of node '{node.name}'{where}"
                if attr.HasField("t"):
                    yield label, attr.t
                for tensor in attr.tensors:
                    yield label, tensor
                sparse = [attr.sparse_tensor] if attr.HasField("sparse_tensor") else []
                for s in [*sparse, *attr.sparse_tensors]:
                    yield f"values of sparse {label}", s.values
                    yield f"indices of sparse {label}", s.indices

    def from_graph(top: onnx.GraphProto, where: str):
        for graph in subgraphs(top):
            inner = where if graph is model.graph else f" in graph '{graph.name}'{where}"
            for init in graph.initializer:
                yield f"initializer '{init.name}'{inner}", init
            for s in graph.sparse_initializer:
                yield f"values of sparse initializer '{s.values.name}'{inner}", s.values
                yield f"indices of sparse initializer '{s.values.name}'{inner}", s.indices
            yield from from_nodes(graph.node, inner)

    yield from from_graph(model.graph, "")
    for function in model.functions:
        where = f" in function '{function.name}'"
        yield from from_nodes(function.node, where)
        for node in function.node:
            for _, g in graph_attributes(node):
                yield from from_graph(g, where)


def outer_references(graph: onnx.GraphProto) -> "set[str]":
    """Return the names a nested ``graph`` (and graphs nested in it) reads from outer scopes."""
    defined = {v.name for v in graph.input} | {i.name for i in graph.initializer}
    defined |= {s.values.name for s in graph.sparse_initializer}
    used: "set[str]" = set()
    for node in graph.node:
        used.update(v for v in node.input if v)
        for _, g in graph_attributes(node):
            used |= outer_references(g)
        defined.update(v for v in node.output if v)
    used.update(v.name for v in graph.output)
    return used - defined


#: Up to this many unsupported nodes are listed one by one; more are summarized by operator,
#: with the first few node names and reasons (``error.nodes`` still lists them all).
LISTED_NODES = 10
_NAMES_PER_OPERATOR = 3
_OPERATORS = 20
_REASONS = 3


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
    if reasons:                 # each operator's first reason before any one's second
        first, rest, seen = [], [], set()
        for reason in reasons:
            op = reason.split(" ", 1)[0]
            (rest if op in seen else first).append(reason)
            seen.add(op)
        reasons = first + rest
        more = f"; and {len(reasons) - _REASONS} more" if len(reasons) > _REASONS else ""
        text += f" ({'; '.join(reasons[:_REASONS])}{more})"
    return text


def fresh_name(taken: "set[str]", base: str) -> str:
    """``base``, or ``base_1``, ``base_2``, ... : the first not in ``taken``, which it joins."""
    name, index = base, 1
    while name in taken:
        name, index = f"{base}_{index}", index + 1
    taken.add(name)
    return name
