"""The ELTW engine: binary element-wise operators of two activation tensors into the
accumulators, which the POST after it requantizes (``hwonnx.golden.qeltwise``)."""

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..config import ArchConfig
from ..isa import ELTW_MODES
from .bram import buffer_read_latency
from .dsp import MULT_LATENCY, RegisteredMultiplier
from .fanout import held, per_lane, replicate
from .layouts import EltwLayout, instr_stream

__all__ = ["EltwiseEngine", "ELTW_STAGES", "READS_PER_WORD", "MULTS_PER_LANE",
           "eltw_latency", "eltwise_cycles"]

#: Activation-buffer reads per word: A, then B, through the buffer's one read port.
READS_PER_WORD = 2
#: Cycles from a word's B operand on the activation buffer's read data to its accumulator
#: write: the data in a register, the zero points, the products
#: (:data:`~hwonnx.hdl.dsp.MULT_LATENCY`: their operands, then the product), the products
#: again in logic, their combination, then the write.
ELTW_STAGES = 6
#: Multipliers of a lane: one, for both of a word's products in consecutive cycles (the engine
#: reads a word in :data:`READS_PER_WORD` cycles: each multiplier would be idle every other
#: cycle; two per lane took 32 of the ULX3S-85F's 156 DSP blocks beside a 16x16 array).
MULTS_PER_LANE = 1


def eltw_latency(config: ArchConfig) -> int:
    """Cycles from the read of a word's B operand to its accumulator write: the activation
    buffer's read (:func:`~hwonnx.hdl.bram.buffer_read_latency`), then
    :data:`ELTW_STAGES`."""
    return buffer_read_latency(config) + ELTW_STAGES


def eltwise_cycles(config: ArchConfig, count: int) -> int:
    """Cycles from an ELTW's dispatch until the engine is idle again (its last accumulator
    write is in the cycle before)."""
    return 1 + READS_PER_WORD * count + eltw_latency(config)


class EltwiseEngine(wiring.Component):
    """Executes ELTW instructions (:data:`hwonnx.isa.ELTW_FIELDS`): for word ``i < count``,
    reads operand A at ``a_addr + i a_stride`` (cycle ``t + 1 + 2i`` after a dispatch in
    ``t``) and operand B at ``b_addr + i b_stride`` (``t + 2 + 2i``), and writes accumulator
    word ``acc_addr + i`` in cycle ``t + 2 + eltw_latency(config) + 2i``: lane ``c < rows`` gets
    ``p = (a - za) * ka``, ``q = (a - za) * (b - zb)`` if ``mul`` else ``(b - zb) * kb``,
    combined as ``p + q``, ``max(p, q)`` or ``min(p, q)`` (``mode``); lanes ``c >= rows``
    get 0.

    Pipeline: the port's word registered, A's zero point subtracted, B's, the products,
    combination, write. The products are 9 x 18 bits, both of a word from one 18 x 18 DSP
    multiplier per lane (:data:`MULTS_PER_LANE`): ``p`` as soon as A's difference is there,
    ``q`` in the next cycle, with B's (which is why ``mul`` multiplies in ``q``: with the
    quantizer's ``ka = kb = 0`` that is the product of the Mul).

    Members
    -------
    instr : ``In(instr_stream())``: an ELTW to start (ready when ``idle``); the payload is
        viewed as an ELTW.
    idle : no read or write outstanding (from ``t + eltwise_cycles(config, count)`` on).
    act_addr, act_en, act_data : activation-buffer read port (shared with the feeder, which
        is drained while the engine runs).
    acc_we, acc_addr, acc_data : accumulator write port; ``acc_we`` has a bit per column,
        all equal, each from a register of its own (``hdl/fanout.py``).
    """

    def __init__(self, config: ArchConfig):
        self._config = config
        super().__init__({
            "instr": In(instr_stream()),
            "idle": Out(1),
            "act_addr": Out(config.act_addr_bits),
            "act_en": Out(1),
            "act_data": In(data.ArrayLayout(signed(8), config.rows)),
            "acc_we": Out(config.cols),
            "acc_addr": Out(config.acc_addr_bits),
            "acc_data": Out(data.ArrayLayout(signed(32), config.cols)),
        })

    @property
    def config(self) -> ArchConfig:
        return self._config

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        lanes = min(cfg.rows, cfg.cols)
        layout = EltwLayout()
        view = layout(self.instr.payload.as_value()[:layout.size])

        cur = Signal(layout)
        active = Signal()
        second = Signal()                    # this cycle reads operand B
        remaining = Signal(layout["count"].shape)
        a_ptr, b_ptr = Signal(26), Signal(26)
        acc_ptr = Signal(cfg.acc_addr_bits)
        # The instruction is taken in every cycle the engine is ready (see ``instr_stream``):
        # ``valid`` drives only ``active``.
        m.d.comb += self.instr.ready.eq(self.idle)
        with m.If(self.idle):
            m.d.sync += [cur.eq(view), second.eq(0), remaining.eq(view.count),
                         a_ptr.eq(view.a_addr), b_ptr.eq(view.b_addr),
                         acc_ptr.eq(view.acc_addr)]
        with m.If(self.instr.valid & self.instr.ready):
            m.d.sync += active.eq(view.count != 0)
        with m.Elif(active):
            m.d.sync += second.eq(~second)
            with m.If(second):
                m.d.sync += [a_ptr.eq(a_ptr + cur.a_stride), b_ptr.eq(b_ptr + cur.b_stride),
                             acc_ptr.eq(acc_ptr + 1), remaining.eq(remaining - 1)]
                with m.If(remaining == 1):
                    m.d.sync += active.eq(0)
        m.d.comb += [self.act_addr.eq(Mux(second, b_ptr, a_ptr)[:cfg.act_addr_bits]),
                     self.act_en.eq(active)]

        # The port's word in a register first, so that the block RAMs' outputs and the mux
        # between them drive only it (into the zero points' subtraction they were the
        # critical path of the IC ResNet-8 ULX3S-85F build, 12.6 ns). ``b_read`` is high
        # while B's word is on the port (the buffer's read latency after its address); then
        # the register holds A's word, in the next cycle B's.
        word = Signal(data.ArrayLayout(signed(8), cfg.rows))
        b_read, b_read_addr = active & second, acc_ptr
        reads = []
        for stage in range(buffer_read_latency(cfg)):
            read, read_addr = (Signal(name=f"b_read_{stage}"),
                               Signal(cfg.acc_addr_bits, name=f"b_read_addr_{stage}"))
            m.d.sync += [read.eq(b_read), read_addr.eq(b_read_addr)]
            b_read, b_read_addr = read, read_addr
            reads.append(read)
        b_valid, b_addr = Signal(), Signal(cfg.acc_addr_bits)
        m.d.sync += [word.eq(self.act_data), b_valid.eq(b_read), b_addr.eq(b_read_addr)]

        # The zero points: A's difference from the word while it holds A (``b_read``), B's in
        # the next cycle. The products, from one RegisteredMultiplier per lane (its operands,
        # then the product: on ECP5 in a DSP block's own registers; combinational between
        # registers in logic, the routing into the block held a ULX3S-85F build at 83 MHz):
        # ``p`` from A's difference and ``ka`` in the cycle B's is made (``turn``), ``q`` from
        # B's in the next; ``p`` is held from the cycle its product is out until ``q``'s is.
        # Then the products in logic registers (from the block's output through the adder or
        # comparison into the write data was 8.5 ns of routing alone: the critical path of a
        # ULX3S-85F build at 88.5 MHz), their combination in a register (the adder, the
        # comparison and the mode's choice were one path with the accumulators' write data:
        # the critical one at 83 MHz), then the write.
        assert MULT_LATENCY == 2
        stages = [(b_valid, b_addr)]
        for i in range(5):
            valid, addr = Signal(name=f"s{i + 1}_valid"), Signal(cfg.acc_addr_bits,
                                                                   name=f"s{i + 1}_addr")
            m.d.sync += [valid.eq(stages[-1][0]), addr.eq(stages[-1][1])]
            stages.append((valid, addr))
        _, s5_addr = stages[-1]
        # Each lane's copy of the fields it reads, so that no register of ``cur`` steers
        # every lane; and of the two selects: ``turn`` (``p``'s operands) and ``p``'s load.
        copies = held(m, view, ("za", "zb", "ka", "kb", "mul", "mode"), self.idle,
                      1 if cfg.compact else lanes, "lane")
        turns = replicate(m, b_read, 1 if cfg.compact else lanes, "eltw_turn")
        loads = replicate(m, stages[1][0], 1 if cfg.compact else lanes, "eltw_p_load")
        for c in range(lanes):
            own = copies[c % len(copies)]
            turn, load = turns[c % len(turns)], loads[c % len(loads)]
            da, db = Signal(signed(9), name=f"da_{c}"), Signal(signed(9), name=f"db_{c}")
            with m.If(b_read):
                m.d.sync += da.eq(word[c] - own.za)
            m.d.sync += db.eq(word[c] - own.zb)
            m.submodules[f"mul_{c}"] = mul = RegisteredMultiplier(9, 18)
            m.d.comb += [mul.a.eq(Mux(turn | own.mul, da, db)),
                         mul.b.eq(Mux(turn, own.ka, Mux(own.mul, db, own.kb)))]
            p, q = (Signal.like(mul.p, name=f"p_{c}"), Signal.like(mul.p, name=f"q_{c}"))
            with m.If(load):
                m.d.sync += p.eq(mul.p)
            m.d.sync += q.eq(mul.p)
            with m.Switch(own.mode):
                with m.Case(ELTW_MODES["max"]):
                    m.d.sync += self.acc_data[c].eq(Mux(p > q, p, q))
                with m.Case(ELTW_MODES["min"]):
                    m.d.sync += self.acc_data[c].eq(Mux(p < q, p, q))
                with m.Default():
                    m.d.sync += self.acc_data[c].eq(p + q)
        write = replicate(m, stages[-2][0], 1 if cfg.compact else cfg.cols, "acc_we")
        # ``idle`` (no read, no stage holding a word) in a register, set from what the stages
        # hold now (they shift: the first read stage takes ``active & second``, each stage
        # the one before), so the dispatcher reads its status from a flip-flop. Running, the
        # engine is not idle in the next cycle (its last read is still a B read to come).
        idle = Signal(init=1)
        started = self.instr.valid & self.instr.ready & (view.count != 0)
        m.d.sync += idle.eq(~active & ~started
                            & ~Cat(*reads, *(v for v, _ in stages[:-1])).any())
        m.d.comb += [self.acc_we.eq(per_lane(write, cfg.cols)), self.acc_addr.eq(s5_addr),
                     self.idle.eq(idle)]
        return m
