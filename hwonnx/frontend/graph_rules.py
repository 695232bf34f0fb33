"""The rules of the ONNX IR specification about graphs, nodes and names ("Graphs", "Names
Within a Graph", "Nodes", "Attributes"), checked on the main graph, on model-local function
bodies and on the branches hwonnx inlines. Every message names the rule and the place."""

import onnx

from ..errors import ModelError
from .common import (
    READ_TYPES,
    ReadLog,
    elem_type_name,
    graph_attributes,
    is_c_identifier,
    outer_references,
)

__all__ = ["name_nodes", "check_graph", "check_body", "check_attributes", "check_value_type",
           "warn_names"]

_SINGLE = {"FLOAT": "f", "INT": "i", "STRING": "s", "TENSOR": "t", "GRAPH": "g",
           "SPARSE_TENSOR": "sparse_tensor", "TYPE_PROTO": "tp"}
_LISTS = {"FLOATS": "floats", "INTS": "ints", "STRINGS": "strings", "TENSORS": "tensors",
          "GRAPHS": "graphs", "SPARSE_TENSORS": "sparse_tensors", "TYPE_PROTOS": "type_protos"}
_ONNX_ML = {"sequence_type": "a sequence type", "map_type": "a map type",
            "optional_type": "an optional type", "sparse_tensor_type": "a sparse tensor type",
            "opaque_type": "an opaque type"}


def name_nodes(nodes, prefix: str = "", taken: "set[str] | None" = None) -> None:
    """Check that node names are unique, then name every unnamed node ``<prefix><op>_<index>``
    (fresh against every name already used), in place."""
    seen: "dict[str, int]" = {}
    for index, node in enumerate(nodes):
        if node.name and node.name in seen:
            raise ModelError(f"Node name '{node.name}' is used by node #{seen[node.name]} and "
                             f"node #{index} (ONNX IR: node names MUST be unique within a "
                             f"graph)")
        seen.setdefault(node.name, index)
    taken = set(seen) | (taken or set())
    for index, node in enumerate(nodes):
        if not node.name:
            name, suffix = f"{prefix}{node.op_type or 'node'}_{index}", 1
            while name in taken:
                name, suffix = f"{prefix}{node.op_type or 'node'}_{index}_{suffix}", suffix + 1
            node.name = name
            taken.add(name)


def check_value_type(value: onnx.ValueInfoProto, role: str, *, shape: bool) -> None:
    """Check that ``value`` (a graph input, output or value_info) is a tensor hwonnx reads;
    with ``shape``, it must also declare its rank."""
    if not value.name:
        raise ModelError(f"{role[0].upper() + role[1:]} must have a name (ONNX IR: graphs MUST "
                         f"define the names of their inputs and outputs)")
    what = f"{role[0].upper() + role[1:]} '{value.name}'"
    which = value.type.WhichOneof("value")
    if which in _ONNX_ML:
        raise ModelError(f"{what} has {_ONNX_ML[which]} (ONNX-ML); hwonnx reads only tensors")
    if which != "tensor_type":
        if not shape:
            return                            # value_info without a type tells nothing
        raise ModelError(f"{what} must have a tensor type (ONNX IR: main graph inputs and "
                         f"outputs MUST define their types)")
    tensor = value.type.tensor_type
    if tensor.elem_type == onnx.TensorProto.UNDEFINED and shape:
        raise ModelError(f"{what} must have an element type (ONNX IR: main graph inputs and "
                         f"outputs MUST define their types)")
    if tensor.elem_type not in READ_TYPES and tensor.elem_type != onnx.TensorProto.UNDEFINED:
        raise ModelError(f"{what} has {elem_type_name(tensor.elem_type)}; hwonnx reads only "
                         f"float, integer and bool tensors")
    if shape and not tensor.HasField("shape"):
        raise ModelError(f"{what} must have a shape (ONNX IR: main graph inputs and outputs "
                         f"declare at least their rank)")
    for axis, dim in enumerate(tensor.shape.dim):
        if dim.HasField("dim_value") and dim.dim_value < 0:
            raise ModelError(f"{what} has size {dim.dim_value} at axis {axis}; sizes must be "
                             f"non-negative")


def check_attributes(node: onnx.NodeProto, where: str, in_function: bool = False) -> None:
    """Check the attributes of ``node``: named, unique, typed, one value each."""
    seen = set()
    for attr in node.attribute:
        if not attr.name:
            raise ModelError(f"Node '{node.name}'{where} has an attribute without a name (ONNX "
                             f"IR: attributes MUST have a name and a type)")
        what = f"Attribute '{attr.name}' of node '{node.name}'{where}"
        if attr.name in seen:
            raise ModelError(f"{what} is given twice (ONNX IR: attribute names MUST be unique "
                             f"for each node)")
        seen.add(attr.name)
        if attr.ref_attr_name:
            if not in_function:
                raise ModelError(f"{what} refers to function attribute '{attr.ref_attr_name}' "
                                 f"outside a function body (ONNX IR: ref_attr_name is only "
                                 f"used within a function body)")
            continue
        kind = onnx.AttributeProto.AttributeType.Name(attr.type) \
            if attr.type in onnx.AttributeProto.AttributeType.values() else None
        if kind is None or kind == "UNDEFINED":
            raise ModelError(f"{what} must have a type (ONNX IR: attributes MUST have a name "
                             f"and a type)")
        present = [f for f in _SINGLE.values() if attr.HasField(f)]
        present += [f for f in _LISTS.values() if len(getattr(attr, f))]
        expected = _SINGLE.get(kind) or _LISTS[kind]
        if [f for f in present if f != expected] or (kind in _SINGLE and not present):
            found = ", ".join(present) or "none"
            raise ModelError(f"{what} has type {kind} and must carry exactly one value in "
                             f"'{expected}', not {found} (ONNX IR: an attribute MUST have only "
                             f"one of the value-carrying properties)")


def check_body(nodes, defined: "dict[str, str]", outputs, scope: str, *,
               outer: "set[str] | frozenset[str]" = frozenset(),
               output_role: str = "Graph output") -> None:
    """Check SSA, definition before use, absence of cycles and defined outputs.

    ``defined`` maps the names defined without a node (inputs, initializers) to their site;
    ``outer`` holds the names visible from enclosing scopes; ``scope`` prefixes messages for
    nested graphs and functions (``''`` for the main graph).
    """
    where = dict(defined)
    producer: "dict[str, int]" = {}
    for index, node in enumerate(nodes):
        for value in node.output:
            if not value:
                continue
            if value in where or value in outer:
                first = where.get(value, "an outer graph")
                raise ModelError(f"{scope}Value '{value}' is defined twice, by {first} and by "
                                 f"node '{node.name}' (ONNX IR: single static assignment)")
            where[value] = f"node '{node.name}'"
            producer[value] = index
    uses = [[v for v in node.input if v] +
            sorted(set().union(*[outer_references(g) for _, g in graph_attributes(node)]))
            for node in nodes]
    known = set(defined) | set(outer)
    for index, node in enumerate(nodes):
        for value in uses[index]:
            if value in known:
                continue
            if value in producer:
                cycle = _cycle(nodes, uses, producer, index)
                if cycle:
                    names = " -> ".join(f"'{nodes[i].name}'" for i in cycle)
                    raise ModelError(f"{scope}Nodes {names} form a cycle (ONNX IR: node "
                                     f"dependencies MUST NOT create cycles)")
                raise ModelError(f"{scope}Node '{node.name}' reads '{value}' before "
                                 f"{where[value]} defines it (ONNX IR: nodes must be in "
                                 f"topological order)")
            sources = "a function input" if scope.startswith("Function") else "a graph input"
            raise ModelError(f"{scope}Node '{node.name}' reads '{value}', which is not "
                             f"{sources}, an initializer or a node output")
        known.update(v for v in node.output if v)
    for value in outputs:
        if value not in known:
            raise ModelError(f"{scope}{output_role} '{value}' is never produced (ONNX IR: "
                             f"every graph output must be defined)")


def _cycle(nodes, uses, producer, start: int) -> "list[int]":
    """Return a dependency cycle through node ``start`` (first and last equal), or []."""
    path, on_path, done = [start], {start}, set()
    stack = [iter(sorted({producer[v] for v in uses[start] if v in producer}))]
    while stack:
        step = next(stack[-1], None)
        if step is None:
            stack.pop()
            done.add(path[-1])
            on_path.discard(path.pop())
            continue
        if step == start:
            return path + [start]
        if step in on_path or step in done:
            continue
        path.append(step)
        on_path.add(step)
        stack.append(iter(sorted({producer[v] for v in uses[step] if v in producer})))
    return []


def check_graph(graph: onnx.GraphProto, rlog: ReadLog, warn: bool = True) -> None:
    """Check the main graph: its name, signature, value namespace and node list; with
    ``warn``, record the names that do not follow C identifier syntax in ``rlog``."""
    if not graph.name:
        raise ModelError("The main graph must have a name (ONNX IR: each graph MUST specify a "
                         "name)")
    inits = [i.name for i in graph.initializer] + [s.values.name for s in
                                                   graph.sparse_initializer]
    for value in graph.input:
        check_value_type(value, "graph input", shape=True)
    for value in graph.output:
        check_value_type(value, "graph output", shape=True)
    for value in graph.value_info:
        check_value_type(value, "value_info entry", shape=False)
    defined: "dict[str, str]" = {}
    for value in graph.input:
        if value.name in defined:
            raise ModelError(f"Value '{value.name}' is defined twice, by a graph input and by a "
                             f"graph input (ONNX IR: single static assignment)")
        defined[value.name] = "a graph input"
    initialized: "set[str]" = set()
    for name in inits:
        if not name:
            raise ModelError("Every initializer must have a name (ONNX IR: an initializer is "
                             "a named tensor value)")
        if name in initialized:
            raise ModelError(f"Value '{name}' is defined twice, by an initializer and by an "
                             f"initializer (ONNX IR: single static assignment)")
        initialized.add(name)
        defined.setdefault(name, "an initializer")
    outputs = [v.name for v in graph.output]
    if len(set(outputs)) != len(outputs):
        twice = next(name for name in outputs if outputs.count(name) > 1)
        raise ModelError(f"Graph output '{twice}' is listed twice (ONNX IR: names MUST be "
                         f"unique in the value namespace)")
    for node in graph.node:
        if not node.op_type:
            raise ModelError(f"Node '{node.name}' must have an op_type")
        check_attributes(node, "")
        strings = [a.name for a in node.attribute if a.name in ("value_string", "value_strings")]
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and strings:
            raise ModelError(f"Constant '{node.name}' has a string value ({strings[0]}); hwonnx "
                             f"reads only float, integer and bool tensors")
    check_body(graph.node, defined, outputs, "")
    if warn:
        warn_names(graph, rlog)


def warn_names(graph: onnx.GraphProto, rlog: ReadLog) -> None:
    """Warn, once per model, about names that do not follow C identifier syntax."""
    values = [v.name for v in (*graph.input, *graph.output)] + \
        [i.name for i in graph.initializer] + \
        [v for node in graph.node for v in node.output if v]
    bad = [name for name in dict.fromkeys([graph.name, *values]) if not is_c_identifier(name)]
    bad += [n.name for n in graph.node if n.name and not is_c_identifier(n.name)]
    if bad:
        shown = ", ".join(f"'{name}'" for name in bad[:3]) + (", ..." if len(bad) > 3 else "")
        rlog.warn(f"{len(bad)} name(s) do not follow C identifier syntax, e.g. {shown}; "
                  f"accepted as they are (ONNX IR: all names MUST adhere to C identifier "
                  f"syntax)")
    params = {d.dim_param for v in (*graph.input, *graph.output, *graph.value_info)
              for d in v.type.tensor_type.shape.dim if d.dim_param}
    bad = sorted(p for p in params if not is_c_identifier(p))
    if bad:
        rlog.warn(f"Dimension variable(s) {', '.join(repr(p) for p in bad)} do not follow C "
                  f"identifier syntax; accepted as they are (ONNX IR: dimension variable "
                  f"names MUST adhere to C identifier syntax)")
