"""Bind symbolic dimensions, apply initializer overrides and run ONNX shape inference."""

import math

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import ModelError
from .common import MAX_TENSOR_ELEMENTS, copy_fields, count_text, extend_messages

#: Initializers with more elements than this are given to shape inference as typed graph
#: inputs instead (their values cannot decide a shape), and so are all initializers once
#: those kept add up to :data:`_INFER_BYTES`: shape inference copies what it is given.
_INFER_ELEMENTS = 1024
_INFER_BYTES = 1 << 24

__all__ = ["bind_input_shapes", "apply_overrides", "infer_shapes", "infer_folded_shapes",
           "value_types", "shape_skeleton", "put_back_initializers"]


def _dims_text(dims, bound: "dict[str, int] | None" = None) -> str:
    bound = bound or {}
    parts = []
    for dim in dims:
        if dim.HasField("dim_value"):
            parts.append(str(dim.dim_value))
        elif dim.dim_param in bound:
            parts.append(str(bound[dim.dim_param]))
        else:
            parts.append(dim.dim_param or "?")
    return "x".join(parts)


def bind_input_shapes(model: onnx.ModelProto,
                      input_shapes: "dict[str, tuple[int, ...]] | None") -> "dict[str, int]":
    """Replace every symbolic dimension of the graph inputs by a size, in place, and return
    the size bound to each dimension variable.

    A ``dim_param`` (or unnamed dimension) on the leading axis of an input binds to 1;
    ``input_shapes`` gives full shapes for named inputs and so binds any ``dim_param``; the
    same ``dim_param`` takes the same size everywhere (outputs and ``value_info`` included).
    ``input_shapes`` may give 1 for a fixed leading (batch) axis of an input of rank 2 or more:
    the model's size is kept here, and :func:`.batch.unbatch` rebinds it to 1 as it does any
    batch (the limit on an input's size is checked per sample, on such a batch).
    Dimensions of outputs and ``value_info`` whose variable stays unbound become unknown, for
    shape inference to fill in.

    Raises
    ------
    ModelError
        If ``input_shapes`` names an unknown input or contradicts the model, a non-batch
        symbolic dimension stays unbound, or an input is larger than hwonnx's tensor limit.
    """
    graph = model.graph
    initialized = {init.name for init in graph.initializer}
    inputs = {value.name: value for value in graph.input if value.name not in initialized}
    user = dict(input_shapes or {})
    bound: "dict[str, int]" = {}
    for name, shape in user.items():
        if name not in inputs:
            raise ModelError(f"Input shape given for '{name}', which is not an input of the "
                             f"model; its inputs are {', '.join(inputs) or 'none'}")
        dims = inputs[name].type.tensor_type.shape.dim
        text = "x".join(str(size) for size in shape)
        if len(shape) != len(dims) or any(int(size) <= 0 for size in shape):
            raise ModelError(f"Input shape {text} given for '{name}' must have {len(dims)} "
                             f"positive dimensions, like the model's {_dims_text(dims)}")
        for axis, (dim, size) in enumerate(zip(dims, shape)):
            if dim.HasField("dim_value") and dim.dim_value != size:
                if axis == 0 and len(dims) >= 2 and size == 1:
                    continue       # a fixed batch rebound to 1: batch.unbatch does it
                hint = " (a fixed batch can be rebound only to 1: hwonnx compiles batch-1 " \
                    "programs)" if axis == 0 and len(dims) >= 2 else ""
                raise ModelError(f"Input shape {text} given for '{name}' contradicts the "
                                 f"model's {_dims_text(dims)} at axis {axis}{hint}")
            if dim.dim_param:
                if bound.setdefault(dim.dim_param, int(size)) != size:
                    raise ModelError(f"Dimension '{dim.dim_param}' is given two sizes, "
                                     f"{bound[dim.dim_param]} and {size}, in input shapes")
    for name, value in inputs.items():
        dims = value.type.tensor_type.shape.dim
        if name not in user and dims and dims[0].dim_param:
            bound.setdefault(dims[0].dim_param, 1)
    for name, value in inputs.items():
        dims = value.type.tensor_type.shape.dim
        for axis, dim in enumerate(dims):
            if dim.HasField("dim_value"):
                continue                     # given the same, or a batch rebound to 1
            if name in user:
                size = int(user[name][axis])
            elif dim.dim_param in bound:
                size = bound[dim.dim_param]
            elif axis == 0:
                size = 1                     # unnamed batch dimension
            else:
                symbol = f"'{dim.dim_param}'" if dim.dim_param else "(unnamed)"
                raise ModelError(f"Input '{name}' has symbolic dimension {symbol} at axis "
                                 f"{axis}; give its size with --input-shape "
                                 f"{name}={_dims_text(dims, bound)}")
            dim.Clear()
            dim.dim_value = size
        count = math.prod(d.dim_value for d in dims)
        if count == 0:
            raise ModelError(f"Input '{name}' has shape {_dims_text(dims)}, with no elements; "
                             f"every dimension of an input must be positive")
        batched = len(dims) >= 2 and dims[0].dim_value > 1   # compiled as batch 1
        if batched:
            count //= dims[0].dim_value
        if count > MAX_TENSOR_ELEMENTS:
            raise ModelError(f"Input '{name}' has shape {_dims_text(dims)}, {count_text(count)} "
                             f"elements{' per sample' if batched else ''}, more than hwonnx's "
                             f"limit of {MAX_TENSOR_ELEMENTS}")
    for value in (*graph.output, *graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if not dim.HasField("dim_value"):
                param = dim.dim_param
                dim.Clear()
                if param in bound:
                    dim.dim_value = bound[param]
    return bound


def apply_overrides(model: onnx.ModelProto,
                    overrides: "dict[str, np.ndarray] | None") -> None:
    """Replace initializer defaults of graph inputs by ``overrides``, then make every
    initialized input a plain constant, in place.

    Raises
    ------
    ModelError
        If an override names no initialized graph input or differs in shape or dtype.
    """
    graph = model.graph
    input_names = {value.name for value in graph.input}
    initializers = {init.name: init for init in graph.initializer if init.name in input_names}
    for name, array in (overrides or {}).items():
        if name not in initializers:
            raise ModelError(f"Cannot override '{name}': it is not a graph input with an "
                             f"initializer; overridable values are "
                             f"{', '.join(initializers) or 'none'}")
        current = numpy_helper.to_array(initializers[name])
        array = np.asarray(array)
        if array.shape != current.shape or array.dtype != current.dtype:
            raise ModelError(f"Override for '{name}' must have shape {current.shape} and dtype "
                             f"{current.dtype} like its initializer, not shape {array.shape} "
                             f"and dtype {array.dtype}")
        initializers[name].CopyFrom(numpy_helper.from_array(array, name))
    kept = [value for value in graph.input if value.name not in initializers]
    del graph.input[:]
    graph.input.extend(kept)


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return ``model`` with inferred types, in strict mode (the ``value_info`` and graph
    outputs found are merged into ``model`` itself, which is returned).

    onnx's shape inference serializes the model and parses its result, so it is given a copy
    without the tensor data that cannot decide a shape (large initializers become typed graph
    inputs): its memory does not grow with the weights.

    Raises
    ------
    ModelError
        If inference fails; the message carries onnx's explanation, which names the node.
    """
    try:
        inferred = onnx.shape_inference.infer_shapes(shape_skeleton(model)[0], check_type=True,
                                                     strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError,
            RuntimeError) as error:
        text = " ".join(str(error).split())
        raise ModelError(f"Shape inference failed: {text}") from error
    for field in ("value_info", "output"):
        del getattr(model.graph, field)[:]
        getattr(model.graph, field).extend(getattr(inferred.graph, field))
    return model


def infer_folded_shapes(model: onnx.ModelProto, nodes: "list[onnx.NodeProto]",
                        constants: "dict[str, np.ndarray]", types: dict) -> dict:
    """``types`` (:func:`value_types`) completed after constant folding: where a run-time value
    of ``nodes`` has no static shape, shape inference runs again on the folded graph
    (``nodes``, reading ``constants``), in which the values it could not follow are constants.
    (torch.onnx computes a ``Slice``'s ends as ``Shape -> Gather -> Add -> Div -> Mul``, as in
    ShuffleNetV2's channel split; onnx's data propagation stops at the ``Div``.)

    Raises
    ------
    ModelError
        If inference fails on the folded graph.
    """
    runtime = {v for node in nodes for v in (*node.input, *node.output)
               if v and v not in constants}
    if all(types.get(v, (0, None))[1] is not None for v in runtime):
        return types
    folded = onnx.ModelProto()
    copy_fields(model, folded, skip=("graph",))
    copy_fields(model.graph, folded.graph,
                skip=("initializer", "sparse_initializer", "node", "value_info"))
    extend_messages(folded.graph.node, nodes)
    folded.ir_version = max(folded.ir_version, 4)
    inputs = {value.name for value in folded.graph.input}
    for name in sorted({v for node in nodes for v in node.input if v in constants}):
        value = np.asarray(constants[name])
        if value.size <= _INFER_ELEMENTS:
            folded.graph.initializer.append(numpy_helper.from_array(value, name))
        elif name not in inputs:
            folded.graph.input.append(onnx.helper.make_tensor_value_info(
                name, onnx.helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)))
    found = value_types(infer_shapes(folded))
    return {**types, **{name: typed for name, typed in found.items()
                        if typed[1] is not None and types.get(name, (0, None))[1] is None}}


def shape_skeleton(model: onnx.ModelProto) -> "tuple[onnx.ModelProto, list[str]]":
    """Return a copy of ``model`` without its large initializers, which become typed graph
    inputs (unless they are inputs already), for onnx's shape inference and version converter
    (which copy what they are given), and the names of the initializers left out."""
    skeleton = onnx.ModelProto()
    copy_fields(model, skeleton, skip=("graph",))
    graph = skeleton.graph
    copy_fields(model.graph, graph, skip=("initializer",))
    kept, moved = 0, []
    inputs = {value.name for value in model.graph.input}
    for init in model.graph.initializer:
        size = math.prod(init.dims)
        if size <= _INFER_ELEMENTS and kept + size * 8 <= _INFER_BYTES:
            graph.initializer.add().CopyFrom(init)
            kept += size * 8
            continue
        if init.name not in inputs:
            graph.input.append(onnx.helper.make_tensor_value_info(
                init.name, init.data_type, list(init.dims)))
        moved.append(init.name)
    return skeleton, moved


def put_back_initializers(result: onnx.ModelProto, model: onnx.ModelProto,
                          moved: "list[str]") -> None:
    """Give ``result`` (made by onnx from :func:`shape_skeleton` of ``model``) the initializers
    left out, and drop the graph inputs that stood in for them, in place."""
    held = set(moved)
    added = held - {value.name for value in model.graph.input}
    inputs = [value for value in result.graph.input if value.name not in added]
    del result.graph.input[:]
    result.graph.input.extend(inputs)
    extend_messages(result.graph.initializer,
                    (i for i in model.graph.initializer if i.name in held))


def value_types(model: onnx.ModelProto) -> "dict[str, tuple[int, tuple[int, ...] | None]]":
    """Map each typed value to ``(elem_type, shape)``; ``shape`` is None unless static."""
    graph = model.graph
    types = {}
    for value in (*graph.input, *graph.value_info, *graph.output):
        tensor = value.type.tensor_type
        shape = None
        if tensor.HasField("shape") and all(d.HasField("dim_value")
                                            for d in tensor.shape.dim):
            shape = tuple(int(d.dim_value) for d in tensor.shape.dim)
        if value.name not in types or types[value.name][1] is None:
            types[value.name] = (tensor.elem_type, shape)
    for init in graph.initializer:
        types[init.name] = (init.data_type, tuple(int(d) for d in init.dims))
    return types
