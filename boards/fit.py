"""Fit check before synthesis: the architecture and the model's images against a board's DSP
blocks, block RAM and logic. Synthesis tools never limit DSP use by themselves, so hwonnx
sizes the design against the device first."""

from dataclasses import dataclass
from math import ceil

from ..config import ArchConfig
from ..errors import ResourceError
from ..hdl.banks import banking
from ..hdl.eltwise import MULTS_PER_LANE
from ..hdl.post import WIDE_MULT_BLOCKS
from .litedram import CONTROLLERS
from .registry import Board

__all__ = ["Usage", "estimate", "check_fits", "check_board_fit"]

# Buffers and their read ports: a block RAM gives one read and one write port, so every
# further read port is a copy (the activations have one, shared by the feeder and the host).
_READ_PORTS = {"prog": 1, "wgt": 1, "par": 1, "act": 1, "acc": 2}


#: Logic cells of the tile walker: two templates, a LOOP and two micro-instructions in
#: flip-flops, the choice between the two, the counters and the address adders.
_WALKER_LUTS = 1900
#: Logic cells of the fetch queue over a program memory of whole instructions
#: (``hdl/fetch.py``: three instructions of ~420 bits in distributed RAM, 4 bits per cell pair).
_FETCH_QUEUE_LUTS = 320
#: Logic cells of one lane of the element-wise engine beside its two multipliers (zero
#: points, the combination, the accumulator write multiplexer), and its controller.
_ELTWISE_LUTS_PER_LANE, _ELTWISE_LUTS = 120, 300


@dataclass(frozen=True)
class Usage:
    dsp: int
    bram_blocks: int
    bram_kbits: int
    luts: int
    memories: "dict[str, int]"     # blocks per buffer
    huge_rams: int = 0             # single-port RAM blocks of the program (iCE40 SPRAM)
    logic_products: int = 0        # PE products built from logic beyond the DSP blocks


def _blocks(depth: int, width: int, board: Board) -> int:
    family = board.family_info
    options = []
    for w in family.block_widths:
        per_block_depth = family.block_bits // w
        options.append(ceil(width / w) * ceil(depth / per_block_depth))
    return min(options)


def estimate(config: ArchConfig, board: Board) -> Usage:
    """Resources of the accelerator for ``config`` on ``board``'s family: an estimate, and the
    place-and-route report is the final word. Against nextpnr's figures in bench/results
    (boards.md, imagenet.md) the block RAMs err on the large side but for two blocks of the
    YOLO-style model (158 against 156), and the logic falls short of nextpnr's count: within
    7% on the iCE40 and the small ECP5 designs, by 15-25% with the tile walker or an external
    memory, by 34-42% with the staging buffers (26,083 LUTs against 15,040)."""
    family = board.family_info
    pes = config.rows * config.cols
    pe_dsp = 0 if family.luts_per_mult else ceil(pes / family.mults_per_dsp)
    lanes = min(config.rows, config.cols) if config.eltwise else 0
    # A requantizer's 32x32 multiply: in one stage as the tool maps it, in five in the
    # post-processor's own 18x18 multipliers (fewer where one DSP block holds two of them).
    wide = (family.dsps_per_wide_mult if config.compact
            else min(family.dsps_per_wide_mult, WIDE_MULT_BLOCKS))
    other_dsp = config.post_lanes_used * wide + MULTS_PER_LANE * lanes     # 9x18: one DSP
    spill = 0
    if family.spill_luts:            # the products beyond the DSP blocks, from logic
        spill = min(pes, max(0, pe_dsp - max(0, board.dsp - other_dsp)))
        pe_dsp -= spill
    dsp = pe_dsp + other_dsp
    shapes = {name: config.buffer_shape(name) for name in ("prog", "wgt", "par",
                                                                        "act")}
    shapes["acc"] = (config.acc_depth, config.cols * config.acc_width)
    huge = 0
    if config.runtime_program and board.huge_rams:
        depth, width = shapes.pop("prog")
        huge = ceil(width / family.huge_width) * ceil(
            depth / (family.huge_bits // family.huge_width))
    memories = {name: _blocks(depth, width, board) * _READ_PORTS[name]
                for name, (depth, width) in shapes.items()}
    if not config.compact:       # the weight buffer in banks (hdl/banks.py), each its blocks
        depth, width = shapes["wgt"]
        bank = banking(width)[0]
        memories["wgt"] = sum(_blocks(min(bank, depth - start), width, board)
                              for start in range(0, depth, bank))
    for name in ("stage_in", "stage_out"):     # the staging buffers
        if getattr(config, f"{name}_depth"):
            memories[name] = _blocks(getattr(config, f"{name}_depth"), config.rows * 8, board)
    if config.lut_tables:              # one copy of the activation tables per column
        memories["lut"] = config.cols * _blocks(config.lut_depth, 8, board)
    blocks = sum(memories.values())
    luts = (family.luts_base + pes * (family.luts_per_pe + family.luts_per_mult)
            + config.cols * 300 + (_WALKER_LUTS if config.walker else 0)
            + (0 if config.runtime_program else _FETCH_QUEUE_LUTS)
            + (_ELTWISE_LUTS + lanes * _ELTWISE_LUTS_PER_LANE if lanes else 0)
            + spill * family.spill_luts
            + (CONTROLLERS[config.ext_memory]["luts"] if config.ext_memory else 0))
    return Usage(dsp, blocks, blocks * family.block_bits // 1024, luts, memories, huge, spill)


def check_fits(config: ArchConfig, board: Board, margin: float = 1.0) -> Usage:
    """Raise :class:`ResourceError` naming the resource, both numbers and a next step when
    ``config`` does not fit ``board``."""
    usage = estimate(config, board)
    family = board.family_info
    capacity_blocks = board.bram_kbits * 1024 // family.block_bits
    problems = []
    if usage.dsp > board.dsp * margin:
        pes = config.rows * config.cols
        logic = (f"; {usage.logic_products} more products from logic"
                 if usage.logic_products else "")
        problems.append(f"{usage.dsp} DSP blocks for a {config.rows}x{config.cols} array "
                        f"({pes - usage.logic_products} multipliers + {config.cols} "
                        f"requantizers{logic}) but the device has {board.dsp}")
    if usage.bram_blocks > capacity_blocks * margin:
        worst = max(usage.memories, key=usage.memories.get)
        problems.append(f"{usage.bram_blocks} block RAMs but the device has "
                        f"{capacity_blocks} (largest: the {worst} buffer, "
                        f"{usage.memories[worst]} blocks)")
    if usage.huge_rams > board.huge_rams:
        problems.append(f"{usage.huge_rams} single-port RAM blocks for the program but the "
                        f"device has {board.huge_rams}")
    if usage.luts > board.luts * margin:
        problems.append(f"about {usage.luts} logic cells but the device has {board.luts}")
    if problems:
        default = board.default_config
        raise ResourceError(
            f"The {config.rows}x{config.cols} accelerator does not fit board '{board.name}': "
            + "; ".join(problems) + f"; try a smaller array or smaller buffers (the board's "
            f"default is {default.rows}x{default.cols} with act/wgt/prog depths "
            f"{default.act_depth}/{default.wgt_depth}/{default.prog_depth})")
    return usage


def check_board_fit(program, board: Board) -> Usage:
    """:func:`check_fits` for a compiled program whose buffers were sized to it: when the
    block RAM is short, the error adds by how much and what each buffer holds."""
    config = program.config
    try:
        return check_fits(config, board)
    except ResourceError as error:
        usage = estimate(config, board)
        capacity = board.bram_kbits * 1024 // board.family_info.block_bits
        if usage.bram_blocks <= capacity:
            raise
        held = ", ".join(f"{name} {usage.memories[name]}"
                         + (f" for {program.words[name]:,} words" if name in program.words
                            else "")
                         for name in sorted(usage.memories, key=usage.memories.get,
                                            reverse=True))
        raise ResourceError(f"{error}; the model's buffers take {usage.bram_blocks} block RAMs "
                            f"({held}), {usage.bram_blocks - capacity} more than the device "
                            f"has") from error
