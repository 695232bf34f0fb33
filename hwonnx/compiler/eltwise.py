"""Lowering of ``QEltwise`` onto the element-wise engine (``hdl/eltwise.py``).

Both operands and the output are natural tensors (``[1, C, H, W]`` images, or ``[1, K]``
vectors as ``[1, K, 1, 1]``), the second operand of the output's shape or per-channel
``[1, C, 1, 1]``. An M tile is up to half the accumulators of pixels, and for each channel block
``j`` (``rows`` channels) of it one ELTW reads word ``j`` of each pixel of A (``a_stride = cb``)
and of B (``b_stride = cb``, or 0 for the per-channel operand: its word ``j`` for every pixel)
into one accumulator half, and one POST requantizes them into word ``j`` of each output pixel
(``nt`` = the block's channels). ELTW ``j + 1`` writes the other half while POST ``j`` runs.
"""

from dataclasses import dataclass, replace

import numpy as np

from ..errors import ResourceError
from ..golden.ops import ELTWISE_MODES
from ..hdl.eltwise import eltwise_cycles
from ..ir import Node
from ..isa import ELTW_MODES
from .layout import Placement, natural_placement
from .micro import Eltw, Post
from .program import LayerPlan

__all__ = ["emit_eltwise"]

assert tuple(ELTW_MODES) == ELTWISE_MODES, "the golden modes are the ISA's, in order"


@dataclass
class _Params:
    """What :meth:`hwonnx.compiler.emitter.TileEmitter.params` reads of a layer."""
    mult: np.ndarray
    shift: np.ndarray
    counts: None = None


def _natural(node: Node, placement: Placement, rows: int, role: str) -> "tuple[int, int, int]":
    """``(channels, pixels, words per pixel)`` of an operand in its natural layout."""
    natural = natural_placement(placement.base, placement.shape, rows)
    if not np.array_equal(placement.logical, natural.logical):
        raise ResourceError(f"Layer '{node.name}': its {role} is a reshaped tensor that is not "
                            f"in its natural [1, C, H, W] or [1, K] order")
    return placement.shape[1], natural.height * natural.width, natural.cb


def emit_eltwise(emitter, node: Node, sources: "list[Placement]", target: Placement
                 ) -> LayerPlan:
    """Store the ELTW and POST instructions of ``node`` (their own, stored as they are, no
    weight bank) and its parameter words; returns its plan (no MACs on the array)."""
    cfg, attrs = emitter.config, node.attrs
    rows = cfg.rows
    if not cfg.eltwise:
        raise ResourceError(f"Layer '{node.name}' needs the element-wise engine, which the "
                            f"{cfg.name} architecture leaves out (ArchConfig.eltwise); use a "
                            f"board or configuration that has it")
    if cfg.cols < rows:
        raise ResourceError(f"Layer '{node.name}' runs on the element-wise engine, which writes "
                            f"the {rows} lanes of an activation word into one accumulator word; "
                            f"the {cfg.rows}x{cfg.cols} array has only {cfg.cols} columns (use "
                            f"an array with at least as many columns as rows)")
    a, b = sources
    channels, pixels, cb = _natural(node, a, rows, "first input")
    b_channels, b_pixels, _ = _natural(node, b, rows, "second input")
    if b_channels != channels or b_pixels not in (1, pixels):
        raise ResourceError(f"Layer '{node.name}': its inputs of shapes {list(a.shape)} and "
                            f"{list(b.shape)} are neither equal nor an image and a per-channel "
                            f"[1, C, 1, 1] tensor")
    broadcast = b_pixels != pixels
    consts = emitter.graph.constants
    mult, shift = consts[node.inputs[2]], consts[node.inputs[3]]
    blocks = [(j * rows, min(rows, channels - j * rows)) for j in range(cb)]
    par_addr = emitter.params(_Params(mult, shift), np.zeros(channels, np.int64), blocks)
    lut = emitter.table_index(node, None if attrs.get("table") is None
                              else tuple(int(v) for v in attrs["table"]))
    engine = Eltw(mode=ELTW_MODES[attrs["mode"]], mul=int(bool(attrs["mul"])),
                  ka=int(attrs["ka"]), kb=int(attrs["kb"]), za=int(attrs["za"]),
                  zb=int(attrs["zb"]), a_stride=cb, b_stride=0 if broadcast else cb)
    records = []
    # A tile's POST runs while the next tile's ELTW reads, so only the last tile's POST is
    # exposed, and each tile costs the engine's turnaround: up to four M tiles (explicit
    # records), as many as that pays for.
    turnaround = eltwise_cycles(cfg, 0) + 1
    tiles = min(range(1, 5), key=lambda n: n * cb * turnaround + -(-pixels // n))
    m_tile = min(pixels, cfg.acc_half, -(-pixels // tiles))
    for m0 in range(0, pixels, m_tile):
        mt = min(m_tile, pixels - m0)
        for j, (n0, nt) in enumerate(blocks):
            acc_base = emitter.output_tile()
            records.append(replace(engine, wait=int(not records), count=mt, acc_addr=acc_base,
                                   a_addr=a.base + m0 * cb + j,
                                   b_addr=b.base + (0 if broadcast else m0 * cb) + j))
            records.append(Post(acc_addr=acc_base, count=mt, par_addr=par_addr[j, None],
                                out_addr=target.base + m0 * cb + j, out_stride=cb, nw=1,
                                lane_off=0, nt=nt, zp=int(attrs["out_zp"]),
                                lo=int(attrs["lo"]), hi=int(attrs["hi"]), lut=lut))
    emitter.add_records(records)
    plan = LayerPlan(node.name, node.op, node.outputs[0], 0)
    plan.tiles = len(records) // 2
    return plan
