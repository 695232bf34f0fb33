"""Token-wise layers (transformers): a ``MatMul`` of a computed ``[1, ..., T, K]`` tensor (``T``
tokens of ``K`` channels, every leading axis 1) by a constant ``[K, N]`` applies one dense
layer to each of the ``T`` rows. That is a 1x1 convolution over ``T`` pixels with ``K`` input
and ``N`` output channels, which the array computes as it is (rows: the reduction ``K``,
columns: the output channels ``N``; the pixels stream).

:func:`view_tokens` rewrites the folded ONNX nodes (after :func:`.onedim.view_1d`, before the
host steps are placed and the nodes converted). A *token region* is a connected set of nodes
on token values (rank 3 or more, every axis but the last two of size 1) that holds at least
one such ``MatMul``, together with the nodes on token values around it that work on each
element: :data:`ELEMENTWISE_OPS` (the bias ``Add``, the residual ``Add`` of two computed
tensors, the table activations, ...) and the nodes of a recognised unary pattern
(:mod:`.patterns`: GELU's Erf form). Inside a region a token value ``[1, ..., T, D]`` is the
image ``[1, D, T, 1]`` (channels first, the tokens as pixels: the data transposed, not
reshaped):

* the ``MatMul`` becomes a ``Conv`` (same name) with kernel ``[1, 1]`` and the weight ``W^T``
  as ``[N, K, 1, 1]``;
* a constant operand, right-aligned to the token value as ``[..., t, d]``, becomes
  ``[1, d, t, 1]`` (a bias ``[N]``: ``[1, N, 1, 1]``, which ``fuse-bias`` adds to the ``Conv``);
  a single value stays as it is.

Where a region reads a token value made outside it, a ``Reshape`` to ``[1, T, 1, D]`` and a
``Transpose`` (perm ``[0, 3, 1, 2]``) view it as the image; where a value of the region is
read outside it (or is a graph output), a ``Transpose`` (perm ``[0, 2, 3, 1]``) and a
``Reshape`` give it back its shape. The model's inputs and outputs keep their shapes: at the
graph's input and output the views are host steps, and so are the views beside a host step
between segments (a ``LayerNormalization``'s result, the values it reads:
:func:`.host.host_steps`); elsewhere the ``Transpose`` is a ``Permute``, copies on the array.
The float graph computes the ONNX function exactly.
"""

from dataclasses import replace

import numpy as np
import onnx
from onnx import helper

from ..ir.tables import TABLE_OPS
from .common import fresh_name, is_default_domain

__all__ = ["ELEMENTWISE_OPS", "is_token_shape", "token_matmul", "view_tokens"]

#: Operators on each element (any operand order, constants broadcast), which a token region
#: takes in on token values.
ELEMENTWISE_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean", "PRelu",
                             "Relu", "Clip", "Identity", "Dropout"}) | frozenset(TABLE_OPS)
#: The view of a token value as an image, and back.
TO_IMAGE, TO_TOKENS = (0, 3, 1, 2), (0, 2, 3, 1)


def is_token_shape(shape) -> bool:
    """Whether ``shape`` is a token value's: rank 3 or more, every axis but the last two 1."""
    return shape is not None and len(shape) >= 3 and all(d == 1 for d in shape[:-2])


def _shape(types, value):
    return types.get(value, (0, None))[1]


def token_matmul(node: onnx.NodeProto, constants: dict, types: dict) -> bool:
    """Whether ``node`` is a ``MatMul`` of a computed token value ``[1, ..., T, K]`` by a
    constant ``[K, N]`` (a dense layer on each token)."""
    if not is_default_domain(node.domain) or node.op_type != "MatMul" or len(node.input) != 2:
        return False
    x, w = node.input
    shape, out = _shape(types, x), _shape(types, node.output[0])
    return x not in constants and w in constants and np.ndim(constants[w]) == 2 \
        and is_token_shape(shape) and np.shape(constants[w])[0] == shape[-1] \
        and out is not None and len(out) == len(shape)


def _padded(shape, rank: int) -> "tuple[int, ...] | None":
    """A constant's ``shape`` right-aligned to ``rank`` axes, or None if it has more."""
    shape = tuple(shape)
    return None if len(shape) > rank else (1,) * (rank - len(shape)) + shape


def _elementwise(node: onnx.NodeProto, constants: dict, types: dict, inner) -> bool:
    """Whether ``node`` works on each element of token values of one rank (its constants
    right-aligned with 1 on the leading axes)."""
    if not is_default_domain(node.domain) or (node.op_type not in ELEMENTWISE_OPS
                                              and node.name not in inner):
        return False
    out = _shape(types, node.output[0]) if node.output else None
    if not is_token_shape(out):
        return False
    runtime = [v for v in node.input if v and v not in constants]
    if not runtime or any(_shape(types, v) is None or len(_shape(types, v)) != len(out)
                          or not is_token_shape(_shape(types, v)) for v in runtime):
        return False
    for value in node.input:
        if value in constants:
            padded = _padded(np.shape(constants[value]), len(out))
            if padded is None or any(d != 1 for d in padded[:-2]):
                return False
    return True


def _regions(members, seeds: "set[str]") -> "set[str]":
    """Names of the ``members`` connected (through the values they share) to a ``seeds``
    node."""
    parent = {node.name: node.name for node in members}

    def find(name):
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    touching: "dict[str, list[str]]" = {}
    for node in members:
        for value in [*node.input, *node.output]:
            if value:
                touching.setdefault(value, []).append(node.name)
    for names in touching.values():
        for other in names[1:]:
            parent[find(other)] = find(names[0])
    roots = {find(name) for name in seeds}
    return {node.name for node in members if find(node.name) in roots}


def _image(shape) -> "tuple[int, ...]":
    """The image ``[1, D, T, 1]`` of the token shape ``[1, ..., T, D]``."""
    return (1, shape[-1], shape[-2], 1)


def view_tokens(nodes: "list[onnx.NodeProto]", constants: dict, types: dict,
                graph_outputs: "set[str]", inner: "frozenset[str]" = frozenset(),
                annotations=None
                ) -> "tuple[list[onnx.NodeProto], dict[str, str], dict[str, str]]":
    """Rewrite the token regions of ``nodes`` (module docstring); ``constants`` and ``types``
    (``name -> (elem_type, shape)``) are updated in place, and so are the
    :class:`.annotate.Annotations` of a pre-quantized model (a transposed weight keeps its
    integers, a view its tensor's parameters). ``inner`` names the nodes inside recognised
    unary patterns. Returns the nodes, the views (the ``Reshape`` and ``Transpose`` nodes
    to and from the images, by name) with what they do (the host runs them at the graph's
    input and output and beside its steps between segments), and the region values renamed
    (old name -> the image's name) because they are also read outside."""
    matmuls = {node.name for node in nodes if token_matmul(node, constants, types)}
    if not matmuls:
        return nodes, {}, {}
    members = [node for node in nodes if node.name in matmuls
               or _elementwise(node, constants, types, inner)]
    region = _regions(members, matmuls)
    inside = {v for n in nodes if n.name in region for v in n.output if v}
    taken = set(types) | set(constants) | {n.name for n in nodes}
    readers_outside = {v for n in nodes if n.name not in region for v in n.input if v}
    renamed = {v: fresh_name(taken, f"{v}_image") for v in sorted(inside)
               if v in readers_outside or v in graph_outputs}
    viewed: "dict[str, str]" = {}       # a token value made outside the region: its image
    made: "dict[str, str]" = {}         # a constant: its form inside the region
    views: "dict[str, str]" = {}
    copies: "list[tuple[str, str]]" = []        # (value, its view): the same data
    result = []

    def layout(op, source, target, shape, name, **attrs):
        types[target] = (types[source][0], tuple(shape))
        copies.append((source, target))
        if op == "Reshape":
            shape_name = fresh_name(taken, f"{target}_shape")
            constants[shape_name] = np.asarray(shape, dtype=np.int64)
            types[shape_name] = (onnx.TensorProto.INT64, (len(shape),))
            return helper.make_node("Reshape", [source, shape_name], [target], name=name)
        return helper.make_node("Transpose", [source], [target], name=name, **attrs)

    for node in nodes:
        if node.name not in region:
            result.append(node)
            continue
        inputs = []
        for index, value in enumerate(node.input):
            if value in constants:
                value = _constant(node, index, value, constants, types, taken, made,
                                  annotations)
            elif value and value not in inside:
                if value not in viewed:
                    shape = _shape(types, value)
                    viewed[value] = fresh_name(taken, f"{value}_image")
                    rows = fresh_name(taken, f"{value}_rows")
                    steps = [layout("Reshape", value, rows, (1, shape[-2], 1, shape[-1]),
                                    fresh_name(taken, f"{value}_rows_view")),
                             layout("Transpose", rows, viewed[value], _image(shape),
                                    fresh_name(taken, f"{value}_image_view"), perm=TO_IMAGE)]
                    result += steps
                    for step in steps:
                        views[step.name] = (f"{step.op_type} views the tokens {list(shape)} "
                                            f"as the pixels of an image {list(_image(shape))}, "
                                            f"which the array reads")
                value = viewed[value]
            inputs.append(renamed.get(value, value))
        outputs = [renamed.get(v, v) for v in node.output]
        for old, new in zip(node.output, outputs):
            if old:
                types[new] = (types[old][0], _image(_shape(types, old)))
        if node.name in matmuls:
            result.append(helper.make_node("Conv", inputs, outputs, name=node.name,
                                           kernel_shape=[1, 1]))
        else:
            result.append(helper.make_node(node.op_type, inputs, outputs, name=node.name,
                                           domain=node.domain))
            result[-1].attribute.extend(node.attribute)
        for old, new in zip(node.output, outputs):
            if old != new:                  # back to the tokens for the readers outside
                shape = _shape(types, old)
                rows = fresh_name(taken, f"{old}_rows")
                result += [layout("Transpose", new, rows, (1, shape[-2], 1, shape[-1]),
                                  fresh_name(taken, f"{old}_rows_view"), perm=TO_TOKENS),
                           layout("Reshape", rows, old, shape, fresh_name(taken, f"{old}_view"))]
                for step in result[-2:]:
                    views[step.name] = (f"{step.op_type} gives the image "
                                        f"{list(_image(shape))} back its tokens {list(shape)}")
    if annotations is not None:             # a view holds its value's data: its parameters
        for _ in range(2):
            for a, b in copies + [(old, new) for old, new in renamed.items()]:
                params = annotations.activations.get(a) or annotations.activations.get(b)
                if params is not None:
                    for v in (a, b):
                        annotations.activations.setdefault(v, params)
    return result, views, renamed


def _constant(node: onnx.NodeProto, index: int, value: str, constants, types, taken,
              made: dict, annotations) -> str:
    """The constant input ``index`` of a region node in the image layout: a ``MatMul``'s weight
    ``[K, N]`` as the ``Conv`` weight ``[N, K, 1, 1]``, an element-wise operand ``[..., t, d]``
    as ``[1, d, t, 1]`` (a single value unchanged)."""
    array = np.asarray(constants[value])
    if node.op_type == "MatMul" and index == 1:
        key = (value, "weight")
        new = np.ascontiguousarray(array.T).reshape(*array.T.shape, 1, 1)
    elif array.size == 1 and array.ndim <= 4:
        return value
    else:
        key = (value, "operand")
        t, d = _padded(array.shape, max(array.ndim, 2))[-2:]
        new = np.ascontiguousarray(array.reshape(t, d).T).reshape(1, d, t, 1)
    if key not in made:
        name = made[key] = fresh_name(taken, f"{value}_image")
        constants[name] = new.astype(array.dtype)
        types[name] = (types.get(value, (onnx.TensorProto.FLOAT, None))[0], tuple(new.shape))
        record = annotations.integers.get(value) if annotations is not None else None
        if record is not None and key[1] == "weight" and record.q.ndim == 2:
            flipped = record.transposed()          # axis 1 (per output channel) becomes 0
            annotations.integers[name] = replace(
                flipped, q=np.ascontiguousarray(flipped.q).reshape(new.shape),
                value=np.ascontiguousarray(flipped.value).reshape(new.shape))
    return made[key]
