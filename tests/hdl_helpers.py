"""Shared helpers of the tier-1 HDL tests (Amaranth simulator).

Every testbench here is one cycle loop: in cycle ``k`` the memory models drive the data they
read at the end of cycle ``k - 1``, the test sets its inputs and samples the outputs, then the
memory models latch the address presented in cycle ``k``, and the clock ticks. Cycle numbers
are therefore exact and shared by the stimulus and the checks.
"""

from amaranth.sim import Simulator

from hwonnx.isa import Op, decode, encode
from hwonnx.config import ArchConfig

__all__ = ["small_config", "SyncReadMemory", "run_cycles", "set_instr", "words"]


def small_config(rows: int, cols: int, lut_tables: int = 0) -> ArchConfig:
    return ArchConfig(rows=rows, cols=cols, act_depth=64, wgt_depth=32, acc_depth=16,
                      par_depth=4, prog_depth=16, lut_tables=lut_tables)


class SyncReadMemory:
    """Testbench model of an Amaranth synchronous read port: the word at the address presented
    in cycle ``k`` (when ``en`` is high, or always without ``en``) is on ``data`` in cycle
    ``k + latency`` (1; 3 for a :class:`~hwonnx.hdl.banks.BankedMemory`, whose ``en`` is
    ignored); with ``en`` low the data port holds its value. ``reads`` logs
    ``(cycle, address)``; ``current`` is the word on the data port (which may be ``None``
    when the consumer is outside the DUT)."""

    def __init__(self, contents, addr, data=None, en=None, latency=1):
        self.contents, self.addr, self.data, self.en = list(contents), addr, data, en
        self.reads: "list[tuple[int, int]]" = []
        self.current = None
        self._pipe = [None] * latency       # the words that reach data in 1, 2, ... cycles

    def cycle_start(self, ctx):
        word = self._pipe[0]
        if word is not None:
            self.current = word
            if self.data is not None:
                ctx.set(self.data, word)
        self._pipe = self._pipe[1:] + [None]

    def cycle_end(self, ctx, cycle):
        if self.en is None or ctx.get(self.en):
            address = ctx.get(self.addr)
            self.reads.append((cycle, address))
            self._pipe[-1] = self.contents[address]


def run_cycles(dut, cycles: int, step, memories=()):
    """Simulate ``cycles`` clock cycles; ``step(ctx, cycle)`` sets inputs and samples outputs
    (combinational outputs settle immediately in a testbench)."""

    async def testbench(ctx):
        for cycle in range(cycles):
            for memory in memories:
                memory.cycle_start(ctx)
            step(ctx, cycle)
            for memory in memories:
                memory.cycle_end(ctx, cycle)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()


def set_instr(ctx, port, fields: dict):
    """Drive an ``InstrLayout`` port with the compiler's own encoding of ``fields`` (so the
    test also checks that the HDL layout decodes what :func:`hwonnx.isa.encode`
    packs). ``fields`` is a dict or a compiled :class:`~hwonnx.compiler.program.Instr`;
    metadata keys the ISA does not know (``layer``) are dropped. ``port`` may be an engine's
    instruction stream (``hdl/layouts.instr_stream``): its payload is driven, and the engine
    must be ready for it (a testbench offers one only then, as the dispatcher does)."""
    fields = getattr(fields, "fields", fields)
    payload = getattr(port, "payload", port)
    ctx.set(payload.as_value(), encode(**{k: v for k, v in fields.items() if k != "layer"}))
    if payload is not port:
        assert ctx.get(port.ready), f"the engine is not ready for {fields}"


def decoded_value(word: int) -> int:
    """The value ``hdl/layouts.DecodedLayout`` should hold for the instruction ``word``,
    from the ISA's own decoding (:func:`hwonnx.isa.decode`): bit ``op`` set, then a LOADW's
    bank, an ELTW's ``wait``, a LOADX's ``par_count == 0`` and a LOADA's or STOREA's ``not
    fence`` (0 for the other ops)."""
    fields = decode(word)
    op, n = fields["op"], len(Op)
    return ((1 << op) | int(op == Op.LOADW and fields["bank"]) << n
            | int(op == Op.ELTW and fields["wait"]) << n + 1
            | int(op == Op.LOADX and fields["par_count"] == 0) << n + 2
            | int(op in (Op.LOADA, Op.STOREA) and not fields["fence"]) << n + 3)


def words(array) -> "list[list[int]]":
    """NumPy ``[n, lanes]`` -> list of Python int lists (values for ``ArrayLayout`` ports)."""
    return [[int(v) for v in row] for row in array]
