"""Copies of a register, so that no single flip-flop drives a whole word of logic.

A select that steers every column of the accumulators' 256 write bits is one register driving
256 LUTs spread over the device: on a ULX3S-85F its routing alone took 8 ns of a 12.8 ns
critical path. :func:`replicate` gives each column a register of its own holding the same value.
Yosys would make the copies one register again (``opt_merge`` merges flip-flops with the same
inputs), so the board build runs :data:`KEEP_REPLICAS` after reading the design: it marks the
copies' flip-flops ``keep``.
"""

from amaranth.hdl import Cat, Signal, Value
from amaranth.lib import data

__all__ = ["replicate", "held", "per_lane", "KEEP_REPLICAS", "REPLICA"]

#: Name of every copy's register (``<name>_replica<i>``): :data:`KEEP_REPLICAS` finds them by it.
REPLICA = "_replica"

#: Yosys commands, run after ``proc`` on the design as read: the flip-flops driving a copy's
#: wire get the ``keep`` attribute (``%ci1``: the wire's driver; ``t:$*dff*``: flip-flop cells).
KEEP_REPLICAS = f"setattr -set keep 1 w:*{REPLICA}* %ci1 t:$*dff* %i"


def replicate(m, value: Value, copies: int, name: str) -> "list[Value]":
    """``copies`` registers, each ``value`` one cycle later. One copy is a plain register,
    which Yosys merges with an equal one (on the iCEBreaker's UP5K, at the edge of its 5,280
    cells, that flip-flop counts)."""
    names = [name] if copies == 1 else [f"{name}{REPLICA}{i}" for i in range(copies)]
    regs = [Signal(len(value), name=n) for n in names]
    m.d.sync += [reg.eq(value) for reg in regs]
    return regs


def held(m, source: data.View, fields: "tuple[str, ...]", load: Value, copies: int,
         name: str) -> "list[data.View]":
    """``copies`` registers of the fields ``fields`` of ``source`` (a struct view), each
    loaded from it in the cycles ``load`` is high, as an engine loads its instruction
    register: every copy always equals the fields of that register, so that each lane reads
    its own instead of one register steering every lane. One copy is a plain register."""
    shape = source.shape()
    layout = data.StructLayout({field: shape[field].shape for field in fields})
    names = [name] if copies == 1 else [f"{name}{REPLICA}{i}" for i in range(copies)]
    regs = [Signal(layout, name=n) for n in names]
    with m.If(load):
        m.d.sync += [reg[field].eq(source[field]) for reg in regs for field in fields]
    return regs


def per_lane(regs: "list[Value]", lanes: int, bit: int = 0) -> Value:
    """A ``lanes``-bit value whose lane ``i`` is bit ``bit`` of copy ``i mod len(regs)``."""
    return Cat(*(regs[i % len(regs)][bit] for i in range(lanes)))
