"""Converters of the sliding-window operators: ``Conv`` (grouped and depthwise included) and
the pools (``AveragePool``, ``MaxPool``, their global forms, and ``ReduceMean``/``ReduceMax``
over the height and width), with their ``pads``, ``strides``, ``dilations`` and ``ceil_mode``
made explicit."""

from dataclasses import replace

import numpy as np
import onnx

from ..errors import ModelError
from ..golden.im2col import windows_touch_input
from ..ir.graph import Node
from .builder import (NO_ACTIVATION, GraphBuilder, check_per_channel, check_windows,
                      explicit_pads, input_4d, node_attrs, unsupported)
from .layout import convert_identity

__all__ = ["CONV_POOL_CONVERTERS"]


def _conv(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    x, shape = input_4d(b, node, "convolution")
    attrs = node_attrs(node)
    weight = b.onnx_constants[node.input[1]]
    kernel = tuple(attrs.get("kernel_shape", weight.shape[2:]))
    if kernel != tuple(weight.shape[2:]):
        raise ModelError(f"Conv '{node.name}' has kernel_shape {list(kernel)}, but its weight "
                         f"has shape {list(weight.shape)}")
    group = int(attrs.get("group", 1))
    if group < 1 or shape[1] % group or weight.shape[0] % group \
            or weight.shape[1] * group != shape[1]:
        raise ModelError(f"Conv '{node.name}' has group={group}, which does not fit its input "
                         f"of {shape[1]} channels and its weight of shape {list(weight.shape)} "
                         f"(it needs input channels = group x weight.shape[1] and output "
                         f"channels divisible by group)")
    strides = tuple(attrs.get("strides", (1, 1)))
    dilations = tuple(attrs.get("dilations", (1, 1)))
    pads = explicit_pads(node, attrs, shape[2:], kernel, strides, dilations)
    check_windows(b, node, shape, kernel, strides, pads, dilations)
    inputs = [x, b.constant(node, node.input[1])]
    if len(node.input) > 2 and node.input[2]:
        check_per_channel(b, node, 2, "bias", weight.shape[0], "output channel")
        inputs.append(b.constant(node, node.input[2]))
    return Node(node.name, "Conv", inputs, (b.value(node.output[0]),),
                {"strides": strides, "pads": pads, "dilations": dilations, "group": group,
                 **NO_ACTIVATION})


def _average_pool(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    x, shape = input_4d(b, node, "pooling")
    attrs = node_attrs(node)
    if attrs.get("ceil_mode", 0):
        raise ModelError(f"AveragePool '{node.name}' has ceil_mode=1; only ceil_mode=0 (output "
                         f"size rounded down) is supported")
    kernel = tuple(attrs["kernel_shape"])
    dilations = tuple(attrs.get("dilations", (1, 1)))
    if dilations != (1, 1):
        raise ModelError(f"AveragePool '{node.name}' has dilations {list(dilations)}; only "
                         f"dilations [1, 1] are supported")
    strides = tuple(attrs.get("strides", (1, 1)))
    pads = explicit_pads(node, attrs, shape[2:], kernel, strides, dilations)
    if any(p >= k for p, k in zip(pads, kernel * 2)):
        raise ModelError(f"AveragePool '{node.name}' has pads {list(pads)}; each must be "
                         f"smaller than the kernel {list(kernel)} (a window must not lie "
                         f"entirely in the padding)")
    check_windows(b, node, shape, kernel, strides, pads, dilations)
    return Node(node.name, "AvgPool", (x,), (b.value(node.output[0]),),
                {"kernel": kernel, "strides": strides, "pads": pads,
                 "count_include_pad": bool(attrs.get("count_include_pad", 0)), **NO_ACTIVATION})


def _max_pool(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    x, shape = input_4d(b, node, "pooling")
    attrs = node_attrs(node)
    if len(node.output) > 1 and node.output[1]:
        raise unsupported(b, node, (
            f"MaxPool '{node.name}' has an Indices output '{node.output[1]}'; only the pooled "
            f"values have a hardware mapping"))
    kernel = tuple(attrs["kernel_shape"])
    dilations = tuple(attrs.get("dilations", (1, 1)))
    strides = tuple(attrs.get("strides", (1, 1)))
    pads = explicit_pads(node, attrs, shape[2:], kernel, strides, dilations)
    if attrs.get("ceil_mode", 0):
        pads = _ceil_pads(node, shape[2:], kernel, strides, pads, dilations)
    check_windows(b, node, shape, kernel, strides, pads, dilations)
    if not all(windows_touch_input(size, k, s, begin, end, d) for size, k, s, begin, end, d
               in zip(shape[2:], kernel, strides, pads[:2], pads[2:], dilations)):
        raise ModelError(f"MaxPool '{node.name}' has pads {list(pads)}; with kernel "
                         f"{list(kernel)} and dilations {list(dilations)} a window would lie "
                         f"entirely in the padding of its {list(shape[2:])} input")
    return Node(node.name, "MaxPool", (x,), (b.value(node.output[0]),),
                {"kernel": kernel, "strides": strides, "pads": pads, "dilations": dilations,
                 **NO_ACTIVATION})


def _ceil_pads(node: onnx.NodeProto, size, kernel, strides, pads, dilations
               ) -> "tuple[int, int, int, int]":
    """A max pool's ``ceil_mode=1`` as more padding at the end (padding never wins a max):
    ONNX rounds the output size up, ``ceil((n + pads - span) / s) + 1``. Where that puts the
    last window's start in the end padding, onnxruntime and ONNX's reference implementation
    drop the window (as PyTorch does) but ONNX's shape inference keeps it: such a pool is
    refused, naming both sizes."""
    ends = []
    for axis, (n, k, s, begin, end, d) in enumerate(zip(size, kernel, strides, pads[:2],
                                                         pads[2:], dilations)):
        span = d * (k - 1) + 1
        out = -(-(n + begin + end - span) // s) + 1
        if (out - 1) * s >= n + begin:
            raise ModelError(
                f"MaxPool '{node.name}' has ceil_mode=1 and its last window along axis "
                f"{axis + 2} would start in the end padding: ONNX's shape inference gives "
                f"{out} outputs there, onnxruntime and ONNX's reference implementation "
                f"{out - 1}; give the pads that make the output size you mean with "
                f"ceil_mode=0")
        ends.append(end + max(0, (out - 1) * s + span - (n + begin + end)))
    return (*pads[:2], *ends)


def _global_max_pool(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    x, shape = input_4d(b, node, "pooling")
    return Node(node.name, "MaxPool", (x,), (b.value(node.output[0]),),
                {"kernel": tuple(shape[2:]), "strides": (1, 1), "pads": (0, 0, 0, 0),
                 "dilations": (1, 1), **NO_ACTIVATION})


def _global_average_pool(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    x, shape = input_4d(b, node, "pooling")
    return Node(node.name, "AvgPool", (x,), (b.value(node.output[0]),),
                {"kernel": tuple(shape[2:]), "strides": (1, 1), "pads": (0, 0, 0, 0),
                 "count_include_pad": True, **NO_ACTIVATION})


def _reduce_pool(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    """``ReduceMean`` or ``ReduceMax`` over height and width of a ``[N, C, H, W]`` value,
    dimensions kept (timm's squeeze-and-excitation blocks): the global pool it is."""
    x, shape = input_4d(b, node, "reduction over height and width")
    attrs = node_attrs(node)
    if len(node.input) > 1 and node.input[1]:             # opset 18: axes an input
        axes = [int(a) for a in np.asarray(b.onnx_constants[node.input[1]]).reshape(-1)]
    else:
        axes = [int(a) for a in attrs.get("axes", ())]
    if not axes and attrs.get("noop_with_empty_axes", 0):
        return convert_identity(b, node)
    if any(not -4 <= a < 4 for a in axes):
        raise ModelError(f"{node.op_type} '{node.name}' has axes {axes}, out of range for its "
                         f"rank-4 input (ONNX: each axis is in [-r, r-1])")
    reduced = sorted({a % 4 for a in axes}) if axes else [0, 1, 2, 3]
    if reduced != [2, 3]:
        raise unsupported(b, node, (
            f"{node.op_type} '{node.name}' reduces axes {reduced} of {list(shape)}; the array "
            f"reduces height and width (axes 2 and 3), a global pool"))
    pool = (_global_average_pool if node.op_type == "ReduceMean" else _global_max_pool)(b, node)
    if attrs.get("keepdims", 1):
        return pool
    # keepdims=0 (ShuffleNet's last ReduceMean): the pool, then a Reshape to [N, C]
    pooled = b.new_value(f"{pool.outputs[0]}:pooled", (shape[0], shape[1], 1, 1))
    out = pool.outputs[0]
    return [replace(pool, outputs=(pooled,)),
            Node(f"{node.name}:flatten", "Reshape", (pooled,), (out,),
                 {"shape": tuple(b.shape(out))})]


CONV_POOL_CONVERTERS = {
    "Conv": _conv, "AveragePool": _average_pool, "MaxPool": _max_pool,
    "GlobalAveragePool": _global_average_pool, "GlobalMaxPool": _global_max_pool,
    "ReduceMean": _reduce_pool, "ReduceMax": _reduce_pool,
}
