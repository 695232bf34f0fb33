"""Quantization of the layers that copy values: ``Slice`` (a window of its input),
``Permute`` (a Transpose that moves data), ``ChannelPermute`` (a channel shuffle) and
``Concat`` along the height or width axis (each source copied to its place). Each keeps its
input's parameters where it can, so the integers
are copied exactly."""

import numpy as np

from ..ir import Node
from .params import add_constants, clamp_bounds, requant_params

__all__ = ["quantize_copy", "concat_multipliers"]


def _identity_or(real: np.ndarray, layer: str) -> "tuple[np.ndarray, ...]":
    """``(mult, shift)`` of the scales ``real``: exactly ``2**30 * 2**-30`` where it is 1."""
    mult, shift = requant_params(real.reshape(-1), layer)
    ones = real.reshape(-1) == 1.0
    mult[ones], shift[ones] = 1 << 30, 30
    return mult.reshape(real.shape).astype(np.int32), shift.reshape(real.shape).astype(np.int32)


def quantize_copy(node: Node, params, qname, constants, types) -> Node:
    """``Slice`` (``QSlice``: ``starts``, ``out_shape``), ``Permute`` (``QPermute``:
    ``perm``) or ``ChannelPermute`` (``QChannelPermute``: ``channels``): the copied
    ``x - in_zp`` requantized by ``s_in / s_out`` per output channel
    (the identity, and the integers exactly, when the output keeps the input's parameters,
    as the quantizer chooses unless a pre-quantized model says otherwise)."""
    x, out = node.inputs[0], node.outputs[0]
    (s_in, zp_in), (s_out, zp_out) = params[x], params[out]
    channels = types[qname[out]].shape[1]
    mult, shift = _identity_or(np.full(channels, s_in / s_out), node.name)
    names = add_constants(node.name, {"mult": mult, "shift": shift}, constants, types)
    lo, hi = clamp_bounds(node, params[out])
    if node.op == "Permute":
        where = {"perm": tuple(node.attrs["perm"])}
    elif node.op == "ChannelPermute":
        where = {"channels": tuple(int(c) for c in node.attrs["channels"])}
    else:
        where = {"starts": tuple(node.attrs["starts"]),
                 "out_shape": tuple(types[qname[out]].shape[1:])}
    return Node(node.name, "Q" + node.op, (qname[x], *names), (qname[out],),
                {"in_zp": zp_in, "out_zp": zp_out, "lo": lo, "hi": hi, **where,
                 "in_scale": s_in, "out_scale": s_out,
                 "relu": bool(node.attrs.get("relu"))})


def concat_multipliers(node: Node, params, channels: "list[int]", s_out: float
                       ) -> "tuple[np.ndarray, np.ndarray]":
    """The multipliers of a ``Concat``: per output channel along the channel axis (``[C]``),
    per source and channel along height or width (``[sources, C]``), each ``s_j / s_out``."""
    if node.attrs["axis"] == 1:
        real = np.concatenate([np.full(c, params[x][0] / s_out)
                               for x, c in zip(node.inputs, channels)])
    else:
        real = np.stack([np.full(channels[0], params[x][0] / s_out) for x in node.inputs])
    return _identity_or(real, node.name)
