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

A region also takes in the nodes on token values that work along the token axis (axis -2), which
in the image is its height: a ``Concat`` along it (a vision transformer's class token before the
patch tokens; a constant input becomes ``[1, d, t, 1]`` too), a ``Gather`` by constant indices
along it (the class token ``x[:, 0]``: row 0 of the image, ``[1, D, 1, 1]``, given back its
shape ``[1, D]`` by a ``Reshape``) and a ``Slice`` of it. On a ``[1, T, D]`` value, which has
no other mapping, such a node makes a region by itself (the class token picked after a
``LayerNormalization``, which the host runs).

Where a region reads a token value made outside it, a ``Reshape`` to ``[1, T, 1, D]`` and a
``Transpose`` (perm ``[0, 3, 1, 2]``) view it as the image; but where that value is the
``Transpose`` of the last two axes of a ``[1, D, T]`` value (a ViT's patch embedding: a
convolution's ``[1, D, h, w]`` output flattened to ``[1, D, h w]``, then transposed to the
tokens), the image is that value's data as it is: one ``Reshape`` to ``[1, D, T, 1]`` of the
value before the ``Transpose`` and the relabelling nodes before it views it (the compiler lays
out ``[1, D, h, w]`` and ``[1, D, h w, 1]`` alike, :func:`hwonnx.compiler.layout.layout_view`),
and the ``Transpose`` is gone where nothing else reads it. Where a value of the region is
read outside it (or is a graph output), a ``Transpose`` (perm ``[0, 2, 3, 1]``) and a
``Reshape`` give it back its shape. The model's inputs and outputs keep their shapes: at the
graph's input and output the views are host steps, and so are the views beside a host step
between segments (a ``LayerNormalization``'s result, the values it reads:
:func:`.host.host_steps`), and so are a ``Gather`` or ``Slice`` of a host value and the
``Reshape`` after it; elsewhere the ``Transpose`` is a ``Permute``, copies on the array. A
``Concat`` that joins a constant (the class token) always runs on the host (the array reads no
constant image): beside the position embedding's ``Add``, itself a host step, it costs no
round trip of its own. The float graph computes the ONNX function exactly.
"""

from dataclasses import replace

import numpy as np
import onnx
from onnx import helper

from ..ir.tables import TABLE_OPS
from .common import fresh_name, is_default_domain
from .onedim import connected_regions

__all__ = ["ELEMENTWISE_OPS", "TOKEN_AXIS_OPS", "is_token_shape", "token_matmul", "view_tokens"]

#: Operators on each element (any operand order, constants broadcast), which a token region
#: takes in on token values.
ELEMENTWISE_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean", "PRelu",
                             "Relu", "Clip", "Identity", "Dropout"}) | frozenset(TABLE_OPS)
#: Operators along the token axis (axis -2: the image's height), which a token region takes in.
TOKEN_AXIS_OPS = frozenset({"Concat", "Gather", "Slice"})
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


def _axis(node: onnx.NodeProto, rank: int, default: int) -> int:
    axis = next((int(a.i) for a in node.attribute if a.name == "axis"), default)
    return axis + rank if axis < 0 else axis


def _ints(constants: dict, node: onnx.NodeProto, index: int) -> "list[int] | None":
    if len(node.input) > index and node.input[index]:
        return [int(v) for v in np.asarray(constants[node.input[index]]).reshape(-1)]
    return None


def _slice_start(node: onnx.NodeProto, constants: dict, shape, out) -> "int | None":
    """Where a ``Slice`` (constant inputs, opset 10 on) of a token value of ``shape`` starts
    along the token axis, when it cuts only that axis, with unit steps (else None)."""
    if len(node.input) < 3 or any(v and v not in constants for v in node.input[1:]):
        return None
    starts, ends = _ints(constants, node, 1), _ints(constants, node, 2)
    axes = _ints(constants, node, 3) or list(range(len(starts)))
    steps = _ints(constants, node, 4) or [1] * len(starts)
    rank, first = len(shape), 0
    for axis, begin, end, step in zip(axes, starts, ends, steps):
        axis += rank if axis < 0 else 0
        if step != 1 or not 0 <= axis < rank:
            return None
        dim = shape[axis]
        begin = min(max(begin + dim if begin < 0 else begin, 0), dim)
        end = min(max(end + dim if end < 0 else end, 0), dim)
        if axis == rank - 2:
            first = begin
        elif (begin, end) != (0, dim):
            return None
    cut = (*shape[:-2], out[-2], shape[-1])
    return first if tuple(out) == cut and out[-2] > 0 else None


def _along_tokens(node: onnx.NodeProto, constants: dict, types: dict) -> bool:
    """Whether ``node`` works along the token axis of token values: a ``Concat`` along it (of
    token values and constants of their rank), a ``Gather`` along it by constant indices (a
    scalar or a list), a ``Slice`` of it only, with unit steps."""
    if not is_default_domain(node.domain) or node.op_type not in TOKEN_AXIS_OPS \
            or not node.output or not node.input or not node.input[0]:
        return False
    out = _shape(types, node.output[0])
    if node.op_type == "Concat":
        if not is_token_shape(out) or _axis(node, len(out), 1) != len(out) - 2 \
                or all(v in constants for v in node.input):
            return False
        shapes = [np.shape(constants[v]) if v in constants else _shape(types, v)
                  for v in node.input]
        return all(s is not None and len(s) == len(out) and is_token_shape(s)
                   and s[-1] == out[-1] for s in shapes)
    x = node.input[0]
    shape = _shape(types, x)
    if x in constants or not is_token_shape(shape) or out is None:
        return False
    if node.op_type == "Gather":
        return len(node.input) > 1 and node.input[1] in constants \
            and np.ndim(constants[node.input[1]]) <= 1 \
            and _axis(node, len(shape), 0) == len(shape) - 2
    return _slice_start(node, constants, shape, out) is not None


def _image(shape) -> "tuple[int, ...]":
    """The image ``[1, D, T, 1]`` of the token shape ``[1, ..., T, D]``."""
    return (1, shape[-1], shape[-2], 1)


def _patch_source(value: str, producers: dict, readers: dict, graph_outputs, types,
                  region: "set[str]") -> "tuple[str, list[onnx.NodeProto]] | None":
    """Where the token value ``value`` [1, ..., T, D] is the ``Transpose`` of the last two axes
    of a [1, ..., D, T] value (a ViT's patch tokens): the value whose data is the image
    [1, D, T, 1] as it is (the ``Transpose``'s input, or the first value before it through
    relabelling nodes each read only by the next: the patch convolution's [1, D, h, w]
    output), and the nodes from there to ``value``; else None (also where that value is
    made in the ``region``, in its image layout)."""
    node = producers.get(value)
    shape = _shape(types, value)
    if node is None or node.op_type != "Transpose" or not is_default_domain(node.domain):
        return None
    rank = len(shape)
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"),
                list(range(rank - 1, -1, -1)))
    if perm != [*range(rank - 2), rank - 1, rank - 2]:
        return None
    chain, source = [node], node.input[0]
    while True:
        before = producers.get(source)
        if before is not None and before.name in region:
            return None
        if before is None or before.op_type not in _RELABELLING \
                or not is_default_domain(before.domain) or source in graph_outputs \
                or [r.name for r in readers.get(source, [])] != [chain[0].name] \
                or _shape(types, before.input[0]) is None:
            return source, chain
        chain.insert(0, before)
        source = before.input[0]


#: ONNX operators that keep the order of the data (a ``Reshape`` or ``Flatten`` of a
#: convolution's output before the patch tokens' ``Transpose``).
_RELABELLING = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})


def view_tokens(nodes: "list[onnx.NodeProto]", constants: dict, types: dict,
                graph_outputs: "set[str]", inner: "frozenset[str]" = frozenset(),
                annotations=None
                ) -> "tuple[list[onnx.NodeProto], dict[str, str], dict[str, str], dict[str, str]]":
    """Rewrite the token regions of ``nodes`` (module docstring); ``constants`` and ``types``
    (``name -> (elem_type, shape)``) are updated in place, and so are the
    :class:`.annotate.Annotations` of a pre-quantized model (a transposed weight keeps its
    integers, a view its tensor's parameters). ``inner`` names the nodes inside recognised
    unary patterns. Returns the nodes; the views (the ``Reshape`` and ``Transpose`` nodes
    to and from the images, and a ``Gather`` or ``Slice`` of the tokens, by name) with what
    they do (the host runs them at the graph's input and output and beside its steps between
    segments); the region values renamed (old name -> the image's name) because they are also
    read outside; and the nodes only the host runs (a ``Concat`` joining a constant), with
    why."""
    matmuls = {node.name for node in nodes if token_matmul(node, constants, types)}
    along = {node.name for node in nodes if _along_tokens(node, constants, types)}
    # a node along the tokens makes a region of its own on [1, T, D] values only (a 4-D
    # token-shaped value, [1, 1, H, W], is an image the array slices and joins as it is)
    seeds = matmuls | {node.name for node in nodes if node.name in along
                       and len(next(_shape(types, v) for v in node.input
                                    if v and v not in constants)) == 3}
    if not seeds:
        return nodes, {}, {}, {}
    members = [node for node in nodes if node.name in matmuls or node.name in along
               or _elementwise(node, constants, types, inner)]
    region = connected_regions(members, seeds, all_outputs=True)
    inside = {v for n in nodes if n.name in region for v in n.output if v}
    taken = set(types) | set(constants) | {n.name for n in nodes}
    readers_outside = {v for n in nodes if n.name not in region for v in n.input if v}
    picked = {n.output[0] for n in nodes if n.name in region and n.op_type == "Gather"
              and np.ndim(constants[n.input[1]]) == 0}      # [1, D]: no token value
    renamed = {v: fresh_name(taken, f"{v}_image") for v in sorted(inside)
               if v in readers_outside or v in graph_outputs or v in picked}
    shapes = {v: _shape(types, v) for n in nodes if n.name in region
              for v in (*n.input, *n.output) if v}         # as in the model, not the images
    producers = {v: n for n in nodes for v in n.output if v}
    readers: "dict[str, list[onnx.NodeProto]]" = {}
    for n in nodes:
        for v in dict.fromkeys(n.input):
            if v:
                readers.setdefault(v, []).append(n)
    viewed: "dict[str, str]" = {}       # a token value made outside the region: its image
    made: "dict[str, str]" = {}         # a constant: its form inside the region
    views: "dict[str, str]" = {}
    host: "dict[str, str]" = {}
    copies: "list[tuple[str, str]]" = []        # (value, its view): the same data
    unread: "list[onnx.NodeProto]" = []         # a patch Transpose the region read
    result = []

    def layout(op, source, target, shape, name, **attrs):
        types[target] = (types[source][0], tuple(shape))
        copies.append((source, target))
        if op == "Reshape":
            return helper.make_node("Reshape", [source, int64(f"{target}_shape", shape)],
                                    [target], name=name)
        return helper.make_node("Transpose", [source], [target], name=name, **attrs)

    def int64(base, values):
        name = fresh_name(taken, base)
        constants[name] = np.asarray(values, dtype=np.int64)
        types[name] = (onnx.TensorProto.INT64, tuple(np.shape(constants[name])))
        return name

    def view_of(value):
        """The image of the token value ``value`` made outside the region."""
        shape = _shape(types, value)
        image = _image(shape)
        patch = _patch_source(value, producers, readers, graph_outputs, types, region)
        viewed[value] = fresh_name(taken, f"{value}_image")
        if patch is not None:
            source, chain = patch
            step = layout("Reshape", source, viewed[value], image,
                          fresh_name(taken, f"{value}_image_view"))
            views[step.name] = (f"Reshape views {list(_shape(types, source))} as the pixels of "
                                f"an image {list(image)}, which the array reads (the tokens "
                                f"{list(shape)} are its transpose: the same data, in the "
                                f"same order)")
            unread.extend(chain)
            return [step]
        rows = fresh_name(taken, f"{value}_rows")
        steps = [layout("Reshape", value, rows, (1, shape[-2], 1, shape[-1]),
                        fresh_name(taken, f"{value}_rows_view")),
                 layout("Transpose", rows, viewed[value], image,
                        fresh_name(taken, f"{value}_image_view"), perm=TO_IMAGE)]
        for step in steps:
            views[step.name] = (f"{step.op_type} views the tokens {list(shape)} as the "
                                f"pixels of an image {list(image)}, which the array reads")
        return steps

    for node in nodes:
        if node.name not in region:
            result.append(node)
            continue
        inputs = []
        for index, value in enumerate(node.input):
            if value in constants:
                if node.op_type in ("Gather", "Slice") and index > 0:
                    continue                    # the indices, the window: below
                value = _constant(node, index, value, constants, types, taken, made,
                                  annotations)
            elif value and value not in inside:
                if value not in viewed:
                    result += view_of(value)
                value = viewed[value]
            inputs.append(renamed.get(value, value))
        outputs = [renamed.get(v, v) for v in node.output]
        x_shape, out_shape = shapes.get(node.input[0]), shapes.get(node.output[0])
        for old, new in zip(node.output, outputs):
            if old:
                types[new] = (types[old][0], (1, x_shape[-1], 1, 1) if old in picked
                              else _image(shapes[old]))
        if node.name in matmuls:
            result.append(helper.make_node("Conv", inputs, outputs, name=node.name,
                                           kernel_shape=[1, 1]))
        elif node.op_type == "Concat":
            result.append(helper.make_node("Concat", inputs, outputs, name=node.name, axis=2))
            made_constant = next((v for v in node.input if v in constants), None)
            if made_constant is not None:
                host[node.name] = (f"Concat joins the constant '{made_constant}' to the "
                                   f"tokens (along the height of the image "
                                   f"{list(_image(out_shape))}); the array reads no "
                                   f"constant image")
        elif node.op_type == "Gather":
            indices = np.asarray(constants[node.input[1]]).reshape(-1)
            result.append(helper.make_node(
                "Gather", [inputs[0], int64(f"{node.name}_rows", indices)], outputs,
                name=node.name, axis=2))
            views[node.name] = (f"Gather picks the tokens {indices.tolist()[:8]}, rows of the "
                                f"image {list(_image(x_shape))}")
        elif node.op_type == "Slice":
            first = _slice_start(node, constants, x_shape, out_shape)
            size = out_shape[-2]
            result.append(helper.make_node(
                "Slice", [inputs[0], int64(f"{node.name}_starts", [first]),
                          int64(f"{node.name}_ends", [first + size]),
                          int64(f"{node.name}_axes", [2])], outputs, name=node.name))
            views[node.name] = (f"Slice cuts the tokens {first} to {first + size - 1}, rows of "
                                f"the image {list(_image(x_shape))}")
        else:
            result.append(helper.make_node(node.op_type, inputs, outputs, name=node.name,
                                           domain=node.domain))
            result[-1].attribute.extend(node.attribute)
        for old, new in zip(node.output, outputs):
            if old == new:
                continue
            shape = shapes[old]
            if old in picked:               # [1, D, 1, 1] -> [1, D]: the same data
                result.append(layout("Reshape", new, old, shape,
                                     fresh_name(taken, f"{old}_view")))
                views[result[-1].name] = (f"Reshape gives the token {list(types[new][1])} "
                                          f"its shape {list(shape)}")
                continue
            rows = fresh_name(taken, f"{old}_rows")     # back to the tokens for the readers
            result += [layout("Transpose", new, rows, (1, shape[-2], 1, shape[-1]),
                              fresh_name(taken, f"{old}_rows_view"), perm=TO_TOKENS),
                       layout("Reshape", rows, old, shape, fresh_name(taken, f"{old}_view"))]
            for step in result[-2:]:
                views[step.name] = (f"{step.op_type} gives the image "
                                    f"{list(_image(shape))} back its tokens {list(shape)}")
    result = _without_unread(result, unread, graph_outputs)
    if annotations is not None:             # a view holds its value's data: its parameters
        for _ in range(2):
            for a, b in copies + [(old, new) for old, new in renamed.items()]:
                params = annotations.activations.get(a) or annotations.activations.get(b)
                if params is not None:
                    for v in (a, b):
                        annotations.activations.setdefault(v, params)
    return result, views, renamed, host


def _without_unread(nodes, candidates, graph_outputs) -> "list[onnx.NodeProto]":
    """``nodes`` without those of ``candidates`` (the patch tokens' ``Transpose`` and the
    relabelling nodes before it) whose outputs nothing reads any more, last first."""
    names = {node.name for node in candidates}
    nodes = list(nodes)
    while True:
        read = {v for node in nodes for v in node.input if v} | set(graph_outputs)
        dead = [node for node in nodes if node.name in names
                and not any(v in read for v in node.output if v)]
        if not dead:
            return nodes
        gone = {node.name for node in dead}
        nodes = [node for node in nodes if node.name not in gone]


def _constant(node: onnx.NodeProto, index: int, value: str, constants, types, taken,
              made: dict, annotations) -> str:
    """The constant input ``index`` of a region node in the image layout: a ``MatMul``'s weight
    ``[K, N]`` as the ``Conv`` weight ``[N, K, 1, 1]``, an element-wise operand or a joined
    constant ``[..., t, d]`` as ``[1, d, t, 1]`` (a single operand value unchanged)."""
    array = np.asarray(constants[value])
    if node.op_type == "MatMul" and index == 1:
        key = (value, "weight")
        new = np.ascontiguousarray(array.T).reshape(*array.T.shape, 1, 1)
    elif array.size == 1 and array.ndim <= 4 and node.op_type != "Concat":
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
