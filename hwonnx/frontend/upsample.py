"""Converters of ``ConvTranspose``, ``Resize``, ``Upsample`` and ``DepthToSpace``: all become
the float op ``ConvTranspose`` (:mod:`hwonnx.golden.transposed`), a nearest upsampling by
integer factors ``(sh, sw)`` as a depthwise one with kernel = stride = ``(sh, sw)`` and weights
of one, a depth-to-space (pixel shuffle) by ``b`` as one with kernel = stride = ``(b, b)`` whose
weight 1 at tap ``(i, j)`` picks the input channel of that output phase (``copy``: the
quantizer keeps the input's scale, so the integer op copies exactly)."""

import numpy as np
import onnx

from ..errors import ModelError
from ..ir.graph import Node
from .builder import NO_ACTIVATION, GraphBuilder, input_4d, node_attrs, unsupported

__all__ = ["UPSAMPLE_CONVERTERS", "nearest_sources", "conv_layout"]


def conv_layout(w: np.ndarray, group: int) -> np.ndarray:
    """ONNX ConvTranspose weights ``[C, M / group, KH, KW]`` in convolution layout ``[M, C /
    group, KH, KW]`` (the same products, indexed by output channel first)."""
    c, mg = w.shape[:2]
    cg = c // group
    return w.reshape(group, cg, mg, *w.shape[2:]).transpose(0, 2, 1, 3, 4).reshape(
        group * mg, cg, *w.shape[2:])


def _conv_transpose(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    x, shape = input_4d(b, node, "transposed convolution")
    attrs = node_attrs(node)
    weight = b.onnx_constants[node.input[1]]              # [C, M / group, KH, KW]
    out = b.value(node.output[0])
    out_shape = b.shape(out)
    kernel = tuple(attrs.get("kernel_shape", weight.shape[2:]))
    group = int(attrs.get("group", 1))
    if weight.ndim != 4 or kernel != tuple(weight.shape[2:]) or group < 1 \
            or shape[1] % group or weight.shape[0] != shape[1]:
        raise ModelError(f"ConvTranspose '{node.name}' has a weight of shape "
                         f"{list(weight.shape)}, kernel_shape {list(kernel)} and group={group}, "
                         f"which do not fit its input of {shape[1]} channels (the weight is "
                         f"[C, M / group, KH, KW])")
    if tuple(attrs.get("dilations", (1, 1))) != (1, 1):
        raise unsupported(b, node, f"ConvTranspose '{node.name}' has dilations "
                                   f"{list(attrs['dilations'])}; only [1, 1] is supported")
    strides = tuple(int(s) for s in attrs.get("strides", (1, 1)))
    outpad = tuple(int(p) for p in attrs.get("output_padding", (0, 0)))
    pads = _pads(node, attrs, shape[2:], kernel, strides, outpad, out_shape[2:])
    m = weight.shape[1] * group
    conv_w = conv_layout(np.asarray(b.array(node, node.input[1])), group)
    inputs = [x, b.new_constant(f"{node.input[1]}_conv_layout", conv_w)]
    if len(node.input) > 2 and node.input[2]:
        bias = b.array(node, node.input[2])
        if bias.shape != (m,):
            raise ModelError(f"ConvTranspose '{node.name}' has bias '{node.input[2]}' of shape "
                             f"{list(bias.shape)}; it must have shape [{m}]")
        inputs.append(b.constant(node, node.input[2]))
    return Node(node.name, "ConvTranspose", tuple(inputs), (out,),
                {"strides": strides, "pads": pads, "group": group,
                 "out_hw": tuple(out_shape[2:]), "source_weight": node.input[1],
                 **NO_ACTIVATION})


def _pads(node, attrs, in_hw, kernel, strides, outpad, out_hw) -> "tuple[int, int, int, int]":
    """Begin and end pads ``(top, left, bottom, right)`` as ONNX defines them (``output_shape``
    and ``auto_pad`` give a total padding that is split), checked against the inferred
    output size."""
    full = [s * (i - 1) + p + k for s, i, p, k in zip(strides, in_hw, outpad, kernel)]
    auto = attrs.get("auto_pad", "NOTSET")
    if "output_shape" in attrs or auto in ("SAME_UPPER", "SAME_LOWER"):
        target = list(attrs["output_shape"])[-2:] if "output_shape" in attrs else \
            [i * s for i, s in zip(in_hw, strides)]
        total = [f - t for f, t in zip(full, target)]
        if auto == "SAME_UPPER":
            begin = [t // 2 for t in total]
        else:
            begin = [t - t // 2 for t in total]
        pads = (*begin, *(t - bg for t, bg in zip(total, begin)))
    elif auto == "VALID":
        pads = (0, 0, 0, 0)
    else:
        pads = tuple(int(p) for p in attrs.get("pads", (0, 0, 0, 0)))
    expect = [f - pads[i] - pads[i + 2] for i, f in enumerate(full)]
    if any(p < 0 for p in pads) or expect != list(out_hw):
        raise ModelError(f"ConvTranspose '{node.name}' has pads {list(pads)}, which with its "
                         f"strides, kernel and output_padding give an output of {expect}, not "
                         f"the {list(out_hw)} shape inference gives")
    return pads


def nearest_sources(mode: str, nearest: str, length: int, scale: int) -> np.ndarray:
    """The input index ONNX ``Resize`` (mode ``nearest``) reads for each output index along an
    axis of ``length`` resized by the integer ``scale``."""
    out = np.arange(length * scale, dtype=np.float64)
    if mode in ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel"):
        x = (out + 0.5) / scale - 0.5
        if mode == "pytorch_half_pixel" and length * scale == 1:
            x = np.zeros_like(out)
    elif mode == "align_corners":
        x = out * (length - 1) / (length * scale - 1) if length * scale > 1 else out * 0
    elif mode == "asymmetric":
        x = out / scale
    elif mode == "tf_half_pixel_for_nn":
        x = (out + 0.5) / scale
    else:
        raise ValueError(mode)
    frac = x - np.floor(x)
    if nearest == "floor":
        index = np.floor(x)
    elif nearest == "ceil":
        index = np.ceil(x)
    elif nearest == "round_prefer_ceil":
        index = np.where(frac == 0.5, np.ceil(x), np.round(x))
    else:                                     # round_prefer_floor (the default)
        index = np.where(frac == 0.5, np.floor(x), np.round(x))
    return np.clip(index, 0, length - 1).astype(np.int64)


_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
          "asymmetric", "tf_half_pixel_for_nn")
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _nearest_upsampling(b: GraphBuilder, node: onnx.NodeProto, mode: str, nearest: str
                        ) -> "Node | list[Node]":
    """The nearest upsampling of a ``[N, C, H, W]`` tensor (a ``ConvTranspose`` copy), or of
    a channels-last ``[N, H, W, C]`` one (axes 1 and 2 scaled, 0 and 3 not, as a Keras or
    channels-last QONNX graph writes it): the same copy between two ``Permute`` nodes, which
    the ``fold-transpose`` pass cancels against the ``Transpose`` nodes an exporter writes
    around it."""
    x, shape = input_4d(b, node, "upsampling")
    out = b.value(node.output[0])
    out_shape = b.shape(out)
    factors = [o // i if i and o % i == 0 else 0 for i, o in zip(shape, out_shape)]
    last = factors[0] == factors[3] == 1 and factors[1] > 1 and factors[2] > 0
    if 0 in factors or factors[0] != 1 or (factors[1] != 1 and not last):
        raise unsupported(b, node, (
            f"{node.op_type} '{node.name}' resizes {list(shape)} to {list(out_shape)}; "
            f"only upsampling of H and W by integer factors is supported (axes 2 and 3, or "
            f"1 and 2 of a channels-last tensor)"))
    if last:
        return _channels_last_upsampling(b, node, x, out, mode, nearest)
    for axis in (2, 3):
        if not np.array_equal(nearest_sources(mode, nearest, shape[axis], factors[axis]),
                              np.arange(out_shape[axis]) // factors[axis]):
            raise unsupported(b, node, (
                f"{node.op_type} '{node.name}' with coordinate_transformation_mode '{mode}' and "
                f"nearest_mode '{nearest}' does not repeat each pixel {factors[axis]} times "
                f"along axis {axis}; only such a nearest upsampling is supported"))
    sh, sw = factors[2:]
    channels = shape[1]
    weight = b.new_constant(f"{node.name}_ones", np.ones((channels, 1, sh, sw), np.float32))
    return Node(node.name, "ConvTranspose", (x, weight), (out,),
                {"strides": (sh, sw), "pads": (0, 0, 0, 0), "group": channels,
                 "out_hw": tuple(out_shape[2:]), "copy": True, **NO_ACTIVATION})


def _channels_last_upsampling(b: GraphBuilder, node: onnx.NodeProto, x: str, out: str,
                              mode: str, nearest: str) -> "list[Node]":
    n, h, w, c = b.shape(x)
    oh, ow = b.shape(out)[1:3]
    nchw = b.new_value(f"{x}:nchw", (n, c, h, w))
    up = b.new_value(f"{out}:nchw", (n, c, oh, ow))
    to_nchw = Node(f"{node.name}:to_nchw", "Permute", (x,), (nchw,),
                   {"perm": (0, 3, 1, 2), **NO_ACTIVATION})
    twin = onnx.NodeProto()
    twin.CopyFrom(node)
    del twin.input[:], twin.output[:]
    twin.input.append(nchw)
    twin.output.append(up)
    copy = _nearest_upsampling(b, twin, mode, nearest)
    to_nhwc = Node(f"{node.name}:to_nhwc", "Permute", (up,), (out,),
                   {"perm": (0, 2, 3, 1), **NO_ACTIVATION})
    return [to_nchw, copy, to_nhwc]


def _resize(b: GraphBuilder, node: onnx.NodeProto) -> "Node | list[Node]":
    attrs = node_attrs(node)
    mode = attrs.get("mode", "nearest")
    transform = attrs.get("coordinate_transformation_mode", "half_pixel")
    nearest = attrs.get("nearest_mode", "round_prefer_floor")
    if mode != "nearest" or transform not in _MODES or nearest not in _NEAREST:
        raise unsupported(b, node, (
            f"Resize '{node.name}' has mode '{mode}', coordinate_transformation_mode "
            f"'{transform}' and nearest_mode '{nearest}'; only nearest upsampling by integer "
            f"factors is supported"))
    if b.opset < 11:                         # Resize-10: asymmetric, floor
        transform, nearest = "asymmetric", "floor"
    return _nearest_upsampling(b, node, transform, nearest)


def _upsample(b: GraphBuilder, node: onnx.NodeProto) -> "Node | list[Node]":
    mode = node_attrs(node).get("mode", "nearest")
    if mode != "nearest":
        raise unsupported(b, node, f"Upsample '{node.name}' has mode '{mode}'; only "
                                   f"'nearest' by integer factors is supported")
    return _nearest_upsampling(b, node, "asymmetric", "floor")


def _depth_to_space(b: GraphBuilder, node: onnx.NodeProto) -> Node:
    """``out[c, h*s + i, w*s + j] = in[k, h, w]`` with ``k = c*s*s + i*s + j`` (mode CRD) or
    ``(i*s + j)*C + c`` (DCR, the default): a transposed convolution of stride and kernel
    ``s`` with weight 1 at ``[k, c, i, j]`` (CRD: ``group = C``, each group ``s*s`` input
    channels to one output channel; DCR: ``group = 1``)."""
    x, shape = input_4d(b, node, "depth-to-space")
    attrs = node_attrs(node)
    s = int(attrs.get("blocksize", 0))
    mode = attrs.get("mode", "DCR")
    if s < 1 or shape[1] % (s * s) or mode not in ("DCR", "CRD"):
        raise ModelError(f"DepthToSpace '{node.name}' has blocksize {s} and mode '{mode}' for "
                         f"an input of {shape[1]} channels; the blocksize must be positive, "
                         f"its square divide the channels and the mode be DCR or CRD")
    out = b.value(node.output[0])
    channels = shape[1] // (s * s)
    if mode == "CRD":
        group, weight = channels, np.zeros((shape[1], 1, s, s), np.float32)
        for c in range(channels):
            for i in range(s):
                for j in range(s):
                    weight[c * s * s + i * s + j, 0, i, j] = 1.0
    else:
        group, weight = 1, np.zeros((shape[1], channels, s, s), np.float32)
        for c in range(channels):
            for i in range(s):
                for j in range(s):
                    weight[(i * s + j) * channels + c, c, i, j] = 1.0
    conv_w = b.new_constant(f"{node.name}_phases", conv_layout(weight, group))
    return Node(node.name, "ConvTranspose", (x, conv_w), (out,),
                {"strides": (s, s), "pads": (0, 0, 0, 0), "group": group,
                 "out_hw": (shape[2] * s, shape[3] * s), "copy": True, **NO_ACTIVATION})


UPSAMPLE_CONVERTERS = {"ConvTranspose": _conv_transpose, "Resize": _resize,
                       "DepthToSpace": _depth_to_space,
                       "Upsample": _upsample}
