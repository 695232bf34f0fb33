"""Data layouts shared by the HDL components and the compiler's encoders."""

from amaranth.hdl import Cat, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.utils import ceil_log2

from ..isa import ACTX_FIELDS, ELTW_FIELDS, FIELDS, LOADX_FIELDS, LOOP_FIELDS, PARAM_BITS, Op
from ..config import ArchConfig

__all__ = ["InstrLayout", "instr_stream", "DecodedLayout", "decoded", "buffer_read",
           "LoopLayout", "EltwLayout", "LoadxLayout", "ActxLayout", "ParamLayout", "PARAM_BITS"]


def _members(fields) -> dict:
    """Struct members of the instruction ``fields`` (:class:`hwonnx.isa.Field`), LSB first."""
    return {f.name: (signed if f.signed else unsigned)(f.width) for f in fields}


class InstrLayout(data.StructLayout):
    """One instruction word; the fields come from :data:`hwonnx.isa.FIELDS`."""

    def __init__(self):
        super().__init__(_members(FIELDS))


def instr_stream() -> stream.Signature:
    """The signature of the instructions the dispatcher hands an engine (``hdl/dispatch.py``):
    ``payload`` the instruction, ``valid`` the dispatcher offers it, ``ready`` the engine can
    take it; it is taken in a cycle with both. An engine takes the payload's fields into its
    registers in every cycle it is ready, so that ``valid`` (the end of the dispatcher's
    decode) drives only its busy flags, never a register's enable."""
    return stream.Signature(InstrLayout())


class DecodedLayout(data.StructLayout):
    """What the dispatcher's accept rules read of an instruction (``hdl/dispatch.py``), decoded
    by :func:`decoded` where the tile walker or the fetch unit writes the instruction and kept
    in registers beside it, so that the dispatcher's decision starts from flip-flops, not from
    compares behind the offer's multiplexers (the 92 MHz ULX3S-85F build's critical path ran
    walker count -> offer mux -> op compare -> accept -> count; the 82 MHz one fetch queue
    read pointer -> the head's bank, wait and parameter count -> accept -> post-processor).

    ``op``: one bit per op code (bit ``i`` for :class:`hwonnx.isa.Op` ``i``); ``bank``: a
    LOADW's weight bank; ``wait``: an ELTW's ``wait``; ``no_params``: a LOADX with
    ``par_count == 0``; ``slotted``: a LOADA or STOREA without ``fence`` (it may wait in the
    DMA engine's slot, ``hdl/dma.py``). Each but ``op`` is 0 for every other op."""

    def __init__(self):
        super().__init__({"op": unsigned(len(Op)), "bank": unsigned(1), "wait": unsigned(1),
                          "no_params": unsigned(1), "slotted": unsigned(1)})


def decoded(instr):
    """The :class:`DecodedLayout` value of ``instr`` (an :class:`InstrLayout` view)."""
    word = instr.as_value()
    is_op = [instr.op == code for code in Op]
    eltw, loadx, actx = EltwLayout(), LoadxLayout(), ActxLayout()
    return Cat(*is_op, is_op[Op.LOADW] & instr.bank,
               is_op[Op.ELTW] & eltw(word[:eltw.size]).wait,
               is_op[Op.LOADX] & (loadx(word[:loadx.size]).par_count == 0),
               (is_op[Op.LOADA] | is_op[Op.STOREA]) & ~actx(word[:actx.size]).fence)


def buffer_read(depth: int, shape) -> wiring.Signature:
    """A buffer's read port as the engine that reads it drives it (amaranth's
    ``memory.ReadPort.Signature``, flipped): ``addr`` and ``en`` out, the word on ``data`` one
    cycle later; joined to the buffer's ``read_port()`` with ``wiring.connect``."""
    return memory.ReadPort.Signature(addr_width=ceil_log2(depth), shape=shape).flip()


class LoopLayout(data.StructLayout):
    """A LOOP instruction (the low bits of the word); the fields come from
    :data:`hwonnx.isa.LOOP_FIELDS`."""

    def __init__(self):
        super().__init__(_members(LOOP_FIELDS))


class EltwLayout(data.StructLayout):
    """An ELTW instruction (the low bits of the word); the fields come from
    :data:`hwonnx.isa.ELTW_FIELDS`."""

    def __init__(self):
        super().__init__(_members(ELTW_FIELDS))


class LoadxLayout(data.StructLayout):
    """A LOADX or LOADP instruction (the low bits of the word); the fields come from
    :data:`hwonnx.isa.LOADX_FIELDS` (LOADP's ``prog_addr`` is LOADX's ``wgt_addr``, and it
    has none of the ``par_*`` fields: 0)."""

    def __init__(self):
        super().__init__(_members(LOADX_FIELDS))


class ActxLayout(data.StructLayout):
    """A LOADA or STOREA instruction (the low bits of the word); the fields come from
    :data:`hwonnx.isa.ACTX_FIELDS`."""

    def __init__(self):
        super().__init__(_members(ACTX_FIELDS))


class ParamLayout(data.ArrayLayout):
    """Post-processing parameters of ``cols`` output channels."""

    def __init__(self, config: ArchConfig):
        channel = data.StructLayout({"bias": signed(32), "mult": signed(32),
                                     "shift": unsigned(8)})
        assert channel.size == PARAM_BITS
        super().__init__(channel, config.cols)
