"""Nested subgraphs: an ``If`` whose condition is a constant is replaced by the branch it
selects (checked against the rules for nested graphs); every other control flow is left for
the support check to refuse by node name."""

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import ModelError
from .common import (
    ReadLog,
    extend_messages,
    graph_attributes,
    is_default_domain,
    opset_versions,
    outer_references,
    subgraphs,
)
from .fold import FoldBudget, evaluate_node
from .graph_rules import check_attributes, check_body, name_nodes

__all__ = ["resolve_constant_ifs", "prune_dead_nodes", "dead_nodes"]

_MAX_ROUNDS = 64


class _Constants:
    """Lazily computes the values that only depend on constants (initializers, ``Constant``
    nodes, ``Shape`` of inputs with static dims, and default-domain nodes over those)."""

    def __init__(self, model: onnx.ModelProto):
        self.graph = model.graph
        self.opsets = opset_versions(model)
        self.values: "dict[str, np.ndarray | None]" = {}
        self.inits = {i.name: i for i in self.graph.initializer}
        self.inputs = {v.name: v for v in self.graph.input if v.name not in self.inits}
        self.producer = {v: n for n in self.graph.node for v in n.output if v}
        self.budget = FoldBudget()

    def get(self, name: str) -> "np.ndarray | None":
        """Return the value of ``name`` if it is a constant hwonnx can fold, else None."""
        stack = [name]
        while stack:                 # iterative: constant chains may be long
            current = stack[-1]
            if current in self.values:
                stack.pop()
                continue
            node = self.producer.get(current)
            if current in self.inits:
                self.values[current] = numpy_helper.to_array(self.inits[current])
            elif node is None or not is_default_domain(node.domain) or \
                    node.op_type in ("If", "Loop", "Scan"):
                self.values[current] = None
            elif node.op_type == "Shape":
                self.values[current] = self._shape(node)
            else:
                pending = [v for v in node.input if v and v not in self.values]
                if pending:
                    stack.extend(pending)
                    continue
                inputs = [v for v in node.input if v]
                results: "dict[str, np.ndarray | None]" = {v: None for v in node.output if v}
                if all(self.values[v] is not None for v in inputs):
                    try:
                        results.update(evaluate_node(
                            node, {v: self.values[v] for v in inputs}, self.opsets,
                            budget=self.budget))
                    except ModelError:
                        pass                  # not a constant hwonnx can fold here
                self.values.update(results)
                self.values.setdefault(current, None)
            stack.pop()
        return self.values[name]

    def _shape(self, node: onnx.NodeProto) -> "np.ndarray | None":
        value = self.inputs.get(node.input[0]) if node.input else None
        dims = value.type.tensor_type.shape.dim if value is not None else None
        if not dims and (value is None or not value.type.tensor_type.HasField("shape")):
            return None
        if not all(d.HasField("dim_value") for d in dims):
            return None
        attrs = {a.name: a.i for a in node.attribute}
        shape = [d.dim_value for d in dims]
        return np.array(shape[attrs.get("start", 0):attrs.get("end", len(shape))], np.int64)


def resolve_constant_ifs(model: onnx.ModelProto, rlog: ReadLog) -> bool:
    """Replace every ``If`` of the main graph whose condition is constant by the selected
    branch, in place, repeating for ``If`` nodes the branches bring in. Return whether any
    was replaced.

    Raises
    ------
    ModelError
        If a selected branch breaks a rule for nested graphs (name, no inputs, outputs that
        match the ``If`` node, SSA against the outer scope); names the node and branch.
    """
    changed = False
    for _ in range(_MAX_ROUNDS):
        graph = model.graph
        constants = _Constants(model)
        for index, node in enumerate(graph.node):
            if node.op_type != "If" or not is_default_domain(node.domain) or not node.input:
                continue
            value = constants.get(node.input[0])
            if value is None:
                continue
            if value.size != 1:
                raise ModelError(f"If '{node.name}' has condition '{node.input[0]}' with "
                                 f"{value.size} elements; it must hold exactly one value")
            which = "then_branch" if bool(value.reshape(-1)[0]) else "else_branch"
            branch = next((a.g for a in node.attribute if a.name == which), None)
            if branch is None:
                raise ModelError(f"If '{node.name}' has no {which} (the If operator needs "
                                 f"both branches)")
            nodes, inits, infos = _inline_branch(model, index, node, which, branch)
            del graph.node[index]
            for offset, new in enumerate(nodes):
                graph.node.insert(index + offset, new)
            extend_messages(graph.initializer, inits)
            graph.value_info.extend(infos)
            rlog.note(f"If '{node.name}' has a constant condition ({which == 'then_branch'}); "
                      f"replaced by its {which}")
            changed = True
            break
        else:
            return changed
    return changed


def _live(graph: onnx.GraphProto) -> "list[bool]":
    """Whether each node of ``graph`` is one some graph output depends on (reads from nested
    graphs count)."""
    live = {value.name for value in graph.output}
    flags = []
    for node in reversed(graph.node):
        flags.append(any(value in live for value in node.output))
        if flags[-1]:
            live.update(node.input)
            for _, nested in graph_attributes(node):
                live |= outer_references(nested)
    return flags[::-1]


def dead_nodes(model: onnx.ModelProto) -> "list[onnx.NodeProto]":
    """Return the main-graph nodes no graph output depends on, in order."""
    return [node for node, live in zip(model.graph.node, _live(model.graph)) if not live]


def prune_dead_nodes(model: onnx.ModelProto) -> int:
    """Remove the main-graph nodes no graph output depends on (reads from nested graphs
    count), in place; return how many were removed."""
    graph = model.graph
    flags = _live(graph)
    removed = flags.count(False)
    if removed:
        kept = [node for node, live in zip(graph.node, flags) if live]
        del graph.node[:]
        extend_messages(graph.node, kept)
    return removed


def _taken_names(model: onnx.ModelProto) -> "set[str]":
    names = set()
    for graph in subgraphs(model.graph):
        names |= {v.name for v in (*graph.input, *graph.output, *graph.value_info)}
        names |= {i.name for i in graph.initializer}
        for node in graph.node:
            names.update(node.input)
            names.update(node.output)
            names.add(node.name)
    return names


def _rename_nested(node: onnx.NodeProto, rename: "dict[str, str]") -> None:
    """Rename the outer references of the graphs nested in ``node``, in place."""
    for _, top in graph_attributes(node):
        for graph in subgraphs(top):
            local = {v.name for v in graph.input} | {i.name for i in graph.initializer}
            local |= {v for n in graph.node for v in n.output}
            for inner in graph.node:
                inner.input[:] = [v if v in local else rename.get(v, v) for v in inner.input]
            for value in graph.output:
                if value.name not in local:
                    value.name = rename.get(value.name, value.name)


def _inline_branch(model, index, node, which, branch):
    scope = f"The {which} of If '{node.name}': "
    if not branch.name:
        raise ModelError(f"{scope}the graph must have a name (ONNX IR: each graph MUST specify "
                         f"a name)")
    if len(branch.input):
        raise ModelError(f"{scope}the graph must have no inputs, not {len(branch.input)} (If "
                         f"branches take no inputs)")
    outputs = [v.name for v in branch.output]
    if not all(outputs):
        raise ModelError(f"{scope}every output must have a name (ONNX IR: nested subgraphs "
                         f"MUST define the names of their outputs)")
    if len(outputs) != len(node.output):
        raise ModelError(f"{scope}the graph has {len(outputs)} output(s), but the If node has "
                         f"{len(node.output)}")
    graph = model.graph
    visible = {v.name for v in graph.input} | {i.name for i in graph.initializer}
    for earlier in graph.node[:index]:
        visible.update(v for v in earlier.output if v)
    inits = {i.name for i in branch.initializer}
    name_nodes(branch.node, prefix="")
    for inner in branch.node:
        check_attributes(inner, f" in the {which} of If '{node.name}'")
    check_body(branch.node, {name: "an initializer" for name in inits}, outputs, scope,
               outer=visible)
    taken = _taken_names(model)
    rename: "dict[str, str]" = {}
    produced = {v for inner in branch.node for v in inner.output if v}
    for value, target in zip(outputs, node.output):
        if target and value in produced and value not in rename:
            rename[value] = target
    for name in [*inits, *sorted(produced)]:
        if name not in rename:
            fresh, suffix = name, 1
            while fresh in taken or fresh in rename.values():
                fresh, suffix = f"{node.name}/{name}" + (f"_{suffix}" if suffix > 1 else ""), \
                    suffix + 1
            rename[name] = fresh
    nodes = []
    for inner in branch.node:
        new = onnx.NodeProto()
        new.CopyFrom(inner)
        new.name = f"{node.name}/{inner.name}"
        new.input[:] = [rename.get(v, v) for v in inner.input]
        new.output[:] = [rename.get(v, v) for v in inner.output]
        _rename_nested(new, rename)
        nodes.append(new)
    for value, target in zip(outputs, node.output):
        if target and rename.get(value) != target:
            nodes.append(onnx.helper.make_node("Identity", [rename.get(value, value)], [target],
                                               name=f"{node.name}/{target}_identity"))
    initializers = []
    for init in branch.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(init)
        copy.name = rename[init.name]
        initializers.append(copy)
    infos = []
    for info in branch.value_info:
        if info.name in rename:
            copy = onnx.ValueInfoProto()
            copy.CopyFrom(info)
            copy.name = rename[info.name]
            infos.append(copy)
    return nodes, initializers, infos
