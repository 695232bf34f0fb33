"""1-D models (audio, time series): convolution and pooling over ``[N, C, L]`` tensors run as
their 2-D forms over ``[N, C, 1, L]`` images of height 1, so that the converters, passes,
quantizer and compiler see only 2-D layers.

:func:`view_1d` rewrites the folded ONNX nodes before the host steps are placed and the nodes
converted. A *1-D region* is a connected set of nodes on rank-3 values that holds at least one
1-D ``Conv``, ``MaxPool``, ``AveragePool``, ``GlobalAveragePool`` or ``GlobalMaxPool``, together
with the nodes on rank-3 values around it that work on each element or channel
(``BatchNormalization``, ``Relu``, ``Clip``, the table activations, ``Add``, ``Mul``,
``Concat``, ``Pad``, ``Identity``, ``Dropout``). Inside a region every value has a height axis
of 1 (axis 2) and the attributes, weights and constants follow it (``kernel_shape [k]`` becomes
``[1, k]``, ``pads [a, b]`` ``[0, a, 0, b]``, a weight ``[M, C, k]`` ``[M, C, 1, k]``, a
``Concat`` axis 2 axis 3, a broadcast constant gets the axis too). Where a region reads a
rank-3 value made outside it (the graph input), a ``Reshape`` views it as ``[N, C, 1, L]``, and
where a value of the region is read outside it (a ``Flatten``, a graph output), a ``Reshape``
gives it back its ``[N, C, L]`` shape: the model's inputs and outputs keep their shapes. The
``Reshape`` of the accelerator's input runs on the host (:func:`.host.host_steps`).
"""

from dataclasses import replace

import numpy as np
import onnx
from onnx import helper

from ..errors import UnsupportedOperatorError
from ..ir.tables import TABLE_OPS
from .common import is_default_domain

__all__ = ["SPATIAL_OPS", "VIEW_OPS", "connected_regions", "view_1d"]

#: The 1-D operators a region is made around (an input of rank 3).
SPATIAL_OPS = frozenset({"Conv", "MaxPool", "AveragePool", "GlobalAveragePool",
                         "GlobalMaxPool"})
#: Operators on each element or channel, which a region takes in on rank-3 values.
VIEW_OPS = SPATIAL_OPS | frozenset({"BatchNormalization", "Relu", "Clip", "Identity",
                                    "Dropout", "Add", "Mul", "Concat", "Pad"}) \
    | frozenset(TABLE_OPS)
_SPATIAL_ATTRS = {"kernel_shape": 1, "strides": 1, "dilations": 1}


def _shape(types, value):
    return types.get(value, (0, None))[1]


def _rank(types, value) -> "int | None":
    shape = _shape(types, value)
    return None if shape is None else len(shape)


def _attr(node: onnx.NodeProto, name: str, default=None):
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def _refusal(node: onnx.NodeProto) -> "str | None":
    """Why a 1-D convolution or pooling node cannot map, or None."""
    op = node.op_type
    name = f"{op} '{node.name}'"
    if op in ("MaxPool", "AveragePool") and _attr(node, "ceil_mode", 0):
        return (f"{name} is a 1-D pooling with ceil_mode=1; only ceil_mode=0 (output size "
                f"rounded down) is supported")
    if op == "AveragePool" and any(d != 1 for d in _attr(node, "dilations", [1])):
        return (f"{name} is a 1-D pooling with dilations {list(_attr(node, 'dilations'))}; "
                f"only dilations [1] are supported")
    if op == "MaxPool" and len(node.output) > 1 and node.output[1]:
        return (f"{name} has an Indices output '{node.output[1]}'; only the pooled values "
                f"have a hardware mapping")
    return None


def _rank_refusal(node: onnx.NodeProto, types) -> "str | None":
    """Why a convolution or pooling node of an input rank other than 3 or 4 cannot map."""
    rank = _rank(types, node.input[0])
    if rank is None or rank in (3, 4):
        return None
    what = "convolution" if node.op_type == "Conv" else "pooling"
    return (f"{node.op_type} '{node.name}' reads '{node.input[0]}' of shape "
            f"{list(_shape(types, node.input[0]))}: only a 1-D ([N, C, L]) or 2-D "
            f"([N, C, H, W]) {what} maps to the array, not {rank - 2}-D")


def _candidates(nodes, types, constants) -> "list[onnx.NodeProto]":
    """Nodes that can join a region: of :data:`VIEW_OPS`, with rank-3 run-time inputs and
    output."""
    found = []
    for node in nodes:
        if not is_default_domain(node.domain) or node.op_type not in VIEW_OPS:
            continue
        runtime = [v for v in node.input if v and v not in constants]
        if node.op_type in ("Add", "Mul", "Concat"):
            reads = runtime
        else:
            reads = [node.input[0]] if node.input and node.input[0] in runtime else []
        if reads and all(_rank(types, v) == 3 for v in reads) \
                and _rank(types, node.output[0]) == 3:
            found.append(node)
    return found


def connected_regions(members, seeds: "set[str]", all_outputs: bool = False) -> "set[str]":
    """Names of the ``members`` connected (through the values they share: their inputs and
    their first output, or every output with ``all_outputs``) to a ``seeds`` node."""
    parent = {node.name: node.name for node in members}

    def find(name):
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    touching: "dict[str, list[str]]" = {}
    for node in members:
        outputs = node.output if all_outputs else node.output[:1]
        for value in [*node.input, *outputs]:
            if value:
                touching.setdefault(value, []).append(node.name)
    for names in touching.values():
        for other in names[1:]:
            parent[find(other)] = find(names[0])
    roots = {find(name) for name in seeds if name in parent}
    return {node.name for node in members if find(node.name) in roots}


def _with_height(shape) -> "tuple[int, ...]":
    return (*shape[:2], 1, *shape[2:])


def view_1d(nodes: "list[onnx.NodeProto]", constants: dict, types: dict, opset: int,
            graph_outputs: "set[str]", annotations=None
            ) -> "tuple[list[onnx.NodeProto], dict[str, str]]":
    """Rewrite the 1-D regions of ``nodes`` as 2-D (see the module docstring); ``constants``
    and ``types`` (``name -> (elem_type, shape)``) are updated in place, and so are the
    :class:`.annotate.Annotations` of a pre-quantized model (a reshaped weight keeps its
    integers, a view its tensor's parameters). Returns the nodes and the names of the
    ``Reshape`` nodes that view a region's rank-3 input as an image, with what they do (the
    host runs the one at the accelerator's input).

    Raises
    ------
    UnsupportedOperatorError
        Listing every convolution or pooling node whose input is neither 1-D nor 2-D and
        every 1-D one of a form hwonnx cannot map (``ceil_mode=1``, dilated average
        pooling, a MaxPool ``Indices`` output), all at once.
    """
    refused, reasons = [], []
    for node in nodes:
        if not is_default_domain(node.domain) or node.op_type not in SPATIAL_OPS:
            continue
        reason = _rank_refusal(node, types) or (
            _refusal(node) if _rank(types, node.input[0]) == 3 else None)
        if reason:
            refused.append((node.name, node.op_type, "", opset))
            reasons.append(reason)
    if refused:
        raise UnsupportedOperatorError.with_reasons(refused, reasons)
    candidates = _candidates(nodes, types, constants)
    spatial = {n.name for n in candidates if n.op_type in SPATIAL_OPS}
    region = connected_regions(candidates, spatial)
    if not region:
        return nodes, {}
    inside = {v for n in nodes if n.name in region for v in n.output if v}
    taken = set(types) | set(constants) | {n.name for n in nodes}

    def fresh(base):
        name, index = base, 1
        while name in taken:
            name, index = f"{base}_{index}", index + 1
        taken.add(name)
        return name

    readers_outside = {v for n in nodes if n.name not in region for v in n.input if v}
    renamed = {}          # a region value also read outside: the region's 2-D name
    for value in sorted(inside):
        if value in readers_outside or value in graph_outputs:
            renamed[value] = fresh(f"{value}_2d")
    viewed = {}           # a rank-3 value made outside, read by the region: its 2-D view
    result, views = [], set()
    for node in nodes:
        if node.name not in region:
            result.append(node)
            continue
        inputs = []
        for index, value in enumerate(node.input):
            if value and value not in inside and value not in constants \
                    and _rank(types, value) == 3:
                if value not in viewed:
                    viewed[value] = fresh(f"{value}_2d")
                    result.append(_reshape(value, viewed[value], types, constants, fresh,
                                           views))
                value = viewed[value]
            elif value in constants:
                value = _constant(node, index, value, constants, types, fresh,
                                  value in readers_outside, annotations)
            inputs.append(renamed.get(value, value))
        outputs = [renamed.get(v, v) for v in node.output]
        for old, new in zip(node.output, outputs):
            if old and _rank(types, old) == 3:
                types[new] = (types[old][0], _with_height(_shape(types, old)))
        result.append(_node_2d(node, inputs, outputs))
        for old, new in zip(node.output, outputs):
            if old != new:                      # back to [N, C, L] for the readers outside
                result.append(_reshape(new, old, types, constants, fresh, None))
    if annotations is not None:             # the same data in both shapes
        for node in result:
            if node.op_type == "Reshape" and node.name not in region:
                given = [annotations.activations.get(v) for v in node.input[:1] + node.output[:1]]
                if (node.name in views or node.input[0] in renamed.values()) \
                        and given.count(None) == 1:
                    params = given[0] or given[1]
                    for v in (node.input[0], node.output[0]):
                        annotations.activations.setdefault(v, params)
    return result, {name: "Reshape views the 1-D input as an image of height 1, which the "
                          "array reads" for name in sorted(views)}


def _reshape(source: str, target: str, types, constants, fresh, views) -> onnx.NodeProto:
    """A ``Reshape`` of ``source`` to ``target``: to its 2-D view (``views`` collects those),
    or (``views`` None) from the 2-D view back to ``target``'s own rank-3 shape."""
    if views is not None:
        shape = _with_height(_shape(types, source))
        types[target] = (types[source][0], shape)
    else:
        shape = _shape(types, target)
    shape_name = fresh(f"{target}_shape")
    constants[shape_name] = np.asarray(shape, dtype=np.int64)
    types[shape_name] = (onnx.TensorProto.INT64, (len(shape),))
    name = fresh(f"{target}_view" if views is not None else f"{target}_1d")
    if views is not None:
        views.add(name)
    return helper.make_node("Reshape", [source, shape_name], [target], name=name)


def _constant(node: onnx.NodeProto, index: int, value: str, constants, types, fresh,
              shared: bool, annotations) -> str:
    """The constant input ``index`` of a region node, with the height axis where it has one:
    a Conv weight ``[M, C, k]`` becomes ``[M, C, 1, k]``, a broadcast operand of ``Add`` or
    ``Mul`` its rank-3 form with axis 2 added, a ``Pad``'s pads and axes the 4-D ones."""
    array = np.asarray(constants[value])
    op = node.op_type
    if op == "Conv" and index == 1:
        if array.ndim != 3:                 # reshaped in place for another region Conv
            return value
        new = array.reshape(_with_height(array.shape))
    elif op in ("Add", "Mul"):
        if array.ndim > 3:
            return value
        padded = (1,) * (3 - array.ndim) + array.shape
        new = array.reshape(_with_height(padded))
    elif op == "Pad" and index == 1 and not (len(node.input) > 3 and node.input[3]):
        pads = array.reshape(-1).astype(np.int64)
        new = np.array([*pads[:2], 0, pads[2], *pads[3:5], 0, pads[5]], np.int64) \
            if pads.size == 6 else pads
    elif op == "Pad" and index == 3:
        axes = [int(a) + (3 if a < 0 else 0) for a in array.reshape(-1)]
        new = np.array([a + 1 if a >= 2 else a for a in axes], np.int64)
    else:
        return value
    if op == "Conv" and not shared:     # in place: a pre-quantized model's record keeps it
        constants[value] = new
        record = annotations.integers.get(value) if annotations is not None else None
        if record is not None:
            annotations.integers[value] = replace(record, q=record.q.reshape(new.shape),
                                                  value=record.value.reshape(new.shape))
        types[value] = (types.get(value, (onnx.TensorProto.FLOAT, None))[0], tuple(new.shape))
        return value
    name = fresh(f"{value}_2d")
    constants[name] = new.astype(array.dtype)
    types[name] = (types.get(value, (onnx.TensorProto.FLOAT, None))[0], tuple(new.shape))
    return name


def _node_2d(node: onnx.NodeProto, inputs, outputs) -> onnx.NodeProto:
    """``node`` with its 1-D attributes as 2-D ones (height: kernel 1, stride 1, dilation 1,
    no padding; a Concat axis 2 or -1 becomes 3 or -1)."""
    attrs = {}
    for attr in node.attribute:
        value = helper.get_attribute_value(attr)
        if node.op_type in SPATIAL_OPS and attr.name in _SPATIAL_ATTRS:
            value = [_SPATIAL_ATTRS[attr.name], *value]
        elif node.op_type in SPATIAL_OPS and attr.name == "pads" and len(value) == 2:
            value = [0, value[0], 0, value[1]]
        elif node.op_type == "Pad" and attr.name == "pads" and len(value) == 6:   # opset < 11
            value = [*value[:2], 0, value[2], *value[3:5], 0, value[5]]
        elif node.op_type == "Concat" and attr.name == "axis":
            axis = int(value) + (3 if value < 0 else 0)
            value = axis + 1 if axis >= 2 else axis
        attrs[attr.name] = value.decode() if isinstance(value, bytes) else value
    return helper.make_node(node.op_type, inputs, outputs, name=node.name, domain=node.domain,
                            **attrs)
