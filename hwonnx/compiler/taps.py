"""Kernel taps packed into the rows: a first convolution over an input with few channels.

A convolution reads one channel block of its input per K tile and kernel tap, so an input of
``C < rows`` channels keeps ``rows - C`` of the array's rows idle for every one of its ``KH *
KW`` taps (KWS's 10x4 convolution over one channel: one row of 16, 40 passes over the output
pixels). When such an input is a graph input read only by that convolution, the host writes
it *packed*: output pixel ``(oy, ox)`` holds, in lanes ``(c KH + ky) KW + kx``, the input
value under tap ``(ky, kx)`` of channel ``c`` of its window, the input's zero point where the
window hangs over the padding. The layer is then a 1x1 convolution with stride 1 over the
packed tensor, ``ceil(C KH KW / rows)`` passes instead of ``KH KW``, and computes the same sums
(integers, in another order), so the golden model is unchanged.

The packed tensor is larger than the input where windows overlap; :func:`hwonnx.compiler.lower`
keeps it only where the activation buffer's high-water mark does not grow
(``docs/architecture.md``, "Packed taps").
"""

import math

import numpy as np

from ..golden.im2col import conv_output_size
from ..ir import Graph, Node
from .layout import Placement

__all__ = ["packable_inputs", "packed_placement", "packed_words", "packed_spec_fields"]


def packable_inputs(graph: Graph, inputs: "list[str]", rows: int) -> "dict[str, Node]":
    """The graph inputs (int8 values of ``inputs``) to pack, each with the convolution that
    reads them: images of fewer channels than ``rows``, read by one ungrouped ``QConv`` with a
    kernel of more than one tap, and by nothing else (no other layer, no graph output)."""
    chosen = {}
    for value in inputs:
        shape = graph.types[value].shape
        readers = graph.consumers(value)
        if len(shape) != 4 or shape[1] >= rows or len(readers) != 1:
            continue
        node = readers[0]
        w = graph.constants.get(node.inputs[1]) if node.op == "QConv" else None
        if w is None or node.inputs[0] != value or int(node.attrs.get("group", 1)) != 1 \
                or w.shape[2] * w.shape[3] == 1:
            continue
        chosen[value] = node
    return chosen


def _windows(node: Node, graph: Graph) -> "tuple[int, ...]":
    """``(C, H, W, KH, KW, OH, OW)`` of the convolution ``node``."""
    _, c, h, w = graph.types[node.inputs[0]].shape
    kh, kw = graph.constants[node.inputs[1]].shape[2:]
    (sy, sx), (dy, dx), pads = node.attrs["strides"], node.attrs["dilations"], \
        node.attrs["pads"]
    oh = conv_output_size(h, kh, sy, pads[0], pads[2], dy)
    ow = conv_output_size(w, kw, sx, pads[1], pads[3], dx)
    return c, h, w, kh, kw, oh, ow


def packed_placement(base: int, node: Node, graph: Graph, rows: int) -> Placement:
    """The placement of ``node``'s input packed for it (see the module): ``OH x OW`` pixels
    of ``ceil(C KH KW / rows)`` words, lanes over the padding filled with the input's zero
    point (``Placement.fill``; the value of a folded constant ``Pad``, ``pad_q``, if any)."""
    c, h, w, kh, kw, oh, ow = _windows(node, graph)
    (sy, sx), (dy, dx), pads = node.attrs["strides"], node.attrs["dilations"], \
        node.attrs["pads"]
    lanes = c * kh * kw
    cb = math.ceil(lanes / rows)
    oy, ox, ci, ky, kx = np.meshgrid(np.arange(oh), np.arange(ow), np.arange(c), np.arange(kh),
                                     np.arange(kw), indexing="ij")
    y, x = oy * sy + ky * dy - pads[0], ox * sx + kx * dx - pads[1]
    inside = (y >= 0) & (y < h) & (x >= 0) & (x < w)
    index = np.where(inside, (ci * h + y) * w + x, -1).reshape(oh * ow, lanes)
    logical = np.full((oh * ow, cb * rows), -1, dtype=np.int64)
    logical[:, :lanes] = index
    pad = node.attrs.get("pad_q")          # a folded constant Pad's value, else real zero
    return Placement(base, oh, ow, cb, (1, c, h, w), logical.reshape(-1),
                     fill=int(node.attrs["in_zp"] if pad is None else pad), packed=True)


def packed_words(node: Node, graph: Graph, rows: int) -> int:
    """Activation words of ``node``'s input packed for it."""
    c, _, _, kh, kw, oh, ow = _windows(node, graph)
    return oh * ow * math.ceil(c * kh * kw / rows)


def packed_spec_fields(w: np.ndarray, source: Placement, rows: int) -> dict:
    """The window of a convolution with weights ``w`` reading its packed input ``source``:
    the weights as a 1x1 convolution over the packed lanes, stride 1, no padding."""
    n_out = w.shape[0]
    phys = np.zeros((n_out, 1, 1, source.cb * rows), dtype=np.int64)
    phys[:, 0, 0, :w[0].size] = w.reshape(n_out, -1)
    return dict(phys=phys, out_hw=(source.height, source.width), strides=(1, 1),
                pads=(0, 0, 0, 0), dilations=(1, 1))
