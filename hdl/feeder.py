"""The MATMUL engine: walks the im2col addresses of one tile and tracks its partial sums."""

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..config import ArchConfig
from .accumulate import acc_write_latency
from .array import array_latency
from .fanout import per_lane, replicate
from .layouts import InstrLayout, instr_stream
from .loader import write_delay

__all__ = ["Feeder", "bank_release", "drain_cycles", "feed_delay", "acc_read_latency"]


def feed_delay(config: ArchConfig) -> int:
    """Cycles from an activation read to its word on the array's ``feed``: the block RAM's
    read, then registers (``hdl/top.py``), so that the block RAM's output (5.6 ns from the
    clock on ECP5) drives only a register, not the padding multiplexer and the array's first
    PEs; as many as the weight loader's :func:`~hwonnx.hdl.loader.write_delay`, so that a
    MATMUL right after a LOADW meets the rows it wrote (with the weight buffer in banks,
    3); without the registers (1) on the smallest devices (``mul_stages`` 1)."""
    return 1 if config.compact else write_delay(config)


def acc_read_latency(config: ArchConfig) -> int:
    """Cycles from an accumulator read (the read-modify-write behind the array,
    ``hdl/accumulate.py``) to the write of the sum: the block RAM's read, its output register
    (not in the compact datapath), then the adder's operand register."""
    return 2 if config.compact else 3


def bank_release(config: ArchConfig) -> int:
    """Cycles from a MATMUL's last issued word until its weight bank may be rewritten (the word
    has passed the last column)."""
    return max(config.cols - 1, 1)


def drain_cycles(config: ArchConfig) -> int:
    """Cycles from a MATMUL's last issued word until the feeder is drained: the read
    (:func:`feed_delay`), the tag pipeline through the array and the accumulator write (into
    the block RAM :func:`~hwonnx.hdl.accumulate.acc_write_latency` cycles after it leaves the
    array)."""
    return feed_delay(config) + array_latency(config) + 1 + acc_write_latency(config)


class Feeder(wiring.Component):
    """Executes MATMUL instructions, one activation word per cycle.

    A dispatched instruction waits in a one-entry ``pending`` slot; it starts in the cycle the
    running one issues its last word (so tiles stream back to back) or later, and, when its
    ``wait`` flag is set, not before the post-processor is idle. Each cycle it issues one
    activation-buffer read at the next im2col position; positions outside the input image
    read as the zero point ``zp``. A tag pipeline follows every word through the array so that
    its sums are added into accumulator word ``acc_addr + i`` (or overwrite it when ``first``).

    Members
    -------
    instr : ``In(instr_stream())``: a MATMUL into the pending slot (ready when ``pending`` is
        0).
    post_idle : the POSTs taken before the MATMUL in the slot are done (the dispatcher's
        ``posts_done``): what a MATMUL with ``wait`` starts on.
    pending, drained : the pending slot is full; no instruction or partial sum is in flight.
    bank_free : ``Out(2)`` weight bank ``b`` may be overwritten (no tile in the feeder uses it
        and its last activation has passed the last column).
    act_addr, act_en : activation-buffer read port.
    feed_pad, feed_zp, feed_bank, feed_dw : :func:`feed_delay` cycles after a read, with its
        word: the word is padding (replace it with ``feed_zp``), its weight bank and whether
        it streams depthwise.

    Depthwise streaming (``dw``): the walk is the same (the compiler makes it run along input
    rows, ``sx = 1``), but only word ``j`` of each row with ``j mod vstride = 0`` and
    ``j <= vlast`` writes an accumulator, the next one (``acc_addr`` counts those words).
    acc_raddr : accumulator read address (:func:`acc_read_latency` cycles before the write:
        the read data is registered, ``hdl/accumulate.py``).
    acc_we, acc_waddr, acc_first : accumulator write of the sums now on the array output.
    acc_max : that write keeps the larger of the accumulator and the sums (``pool_max``)
        instead of adding them (``first`` still overwrites).
    acc_first and acc_max have one bit per column, all equal: each column's comes from a
        register of its own (:func:`~.fanout.replicate`; one register for all in the compact
        datapath). No two writes in consecutive cycles go to the same word (a MATMUL waits a
        cycle, see ``collide``).
    completed : MATMULs whose last accumulator write is done (counted from the cycle after;
        modulo 2**16): the dispatcher's POST slot compares it with the MATMULs it has taken
        (``hdl/dispatch.py``).
    """

    def __init__(self, config: ArchConfig):
        self._config = config
        super().__init__({
            "instr": In(instr_stream()),
            "post_idle": In(1),
            "pending": Out(1),
            "drained": Out(1),
            "bank_free": Out(2),
            "act_addr": Out(config.act_addr_bits),
            "act_en": Out(1),
            "feed_pad": Out(1),
            "feed_zp": Out(signed(8)),
            "feed_bank": Out(1),
            "feed_dw": Out(1),
            "acc_raddr": Out(config.acc_addr_bits),
            "acc_we": Out(1),
            "acc_waddr": Out(config.acc_addr_bits),
            "acc_first": Out(config.cols),
            "acc_max": Out(config.cols),
            "completed": Out(16),
        })

    @property
    def config(self) -> ArchConfig:
        return self._config

    def elaborate(self, platform):
        m = Module()
        cfg = self.config

        pend = Signal(InstrLayout())
        pend_valid = Signal()
        m.d.comb += self.instr.ready.eq(~pend_valid)
        with m.If(~pend_valid):             # taken while the slot is empty (instr_stream)
            m.d.sync += pend.eq(self.instr.payload)
        with m.If(self.instr.valid & self.instr.ready):
            m.d.sync += pend_valid.eq(1)

        # Running tile state.
        running = Signal()
        cur = Signal(InstrLayout())
        remaining = Signal(InstrLayout()["count"].shape)
        addr = Signal(signed(26))
        row_addr = Signal(signed(26))
        ox = Signal(InstrLayout()["ow"].shape)
        ix = Signal(signed(18))
        iy = Signal(signed(18))
        acc_addr = Signal(cfg.acc_addr_bits)
        phase = Signal(InstrLayout()["vstride"].shape)     # ox mod vstride (depthwise)
        # ``remaining == 1`` and ``ox == ow - 1`` in registers of their own, set as the counters
        # step, so that no compare of a counter steers ``start`` (the enable of ``cur``) or
        # the address registers' multiplexers; the compares themselves in the compact
        # datapath (the UP5K has no logic cell to spare: the registers' compares cost more).
        one_left, row_end = Signal(), Signal()
        tracked = not cfg.compact
        if not tracked:
            m.d.comb += [one_left.eq(remaining == 1), row_end.eq(ox == cur.ow - 1)]
        last = Signal()
        keep = Signal()                      # this word's sums are written
        m.d.comb += [last.eq(running & one_left),
                     keep.eq(running & (~cur.dw | ((phase == 0) & (ox <= cur.vlast))))]

        # Not back to back with a MATMUL whose last word writes the word this one's first word
        # writes: its read would come a cycle before that write, and the accumulators do not
        # forward (the adder's loop would be the critical path, hdl/accumulate.py). A cycle
        # later the read port's transparency shows the write (hwonnx/compiler/timing.py).
        collide = Signal()
        start = Signal()
        m.d.comb += [
            collide.eq(last & keep & (pend.acc_addr[:cfg.acc_addr_bits] == acc_addr)),
            start.eq(pend_valid & (~running | (last & ~collide))
                     & (~pend.wait | self.post_idle)),
        ]
        with m.If(start):
            m.d.sync += [
                cur.eq(pend), pend_valid.eq(0), running.eq(1),
                remaining.eq(pend.count),
                addr.eq(pend.act_addr),
                row_addr.eq(pend.act_row),
                ox.eq(pend.ox0), ix.eq(pend.ix0), iy.eq(pend.iy0),
                acc_addr.eq(pend.acc_addr), phase.eq(0),
            ]
            if tracked:
                m.d.sync += [one_left.eq(pend.count == 1), row_end.eq(pend.ox0 + 1 == pend.ow)]
        with m.Elif(running):
            m.d.sync += remaining.eq(remaining - 1)
            if tracked:
                m.d.sync += one_left.eq(remaining == 2)
            with m.If(keep):
                m.d.sync += acc_addr.eq(acc_addr + 1)
            with m.If(last):
                m.d.sync += running.eq(0)
            with m.If(row_end):
                m.d.sync += [
                    ox.eq(0), ix.eq(cur.ixr), iy.eq(iy + cur.sy), phase.eq(0),
                    row_addr.eq(row_addr + cur.step_y), addr.eq(row_addr + cur.step_y),
                ]
                if tracked:
                    m.d.sync += row_end.eq(cur.ow == 1)
            with m.Else():
                m.d.sync += [ox.eq(ox + 1), ix.eq(ix + cur.sx), addr.eq(addr + cur.step_x),
                             phase.eq(Mux(phase == cur.vstride - 1, 0, phase + 1))]
                if tracked:
                    m.d.sync += row_end.eq(ox + 2 == cur.ow)

        inside = Signal()
        m.d.comb += [
            inside.eq((iy >= 0) & (iy < cur.ih) & (ix >= 0) & (ix < cur.iw)),
            self.act_addr.eq(addr[:cfg.act_addr_bits]),
            self.act_en.eq(running & inside),
        ]
        feed = Cat(~inside, cur.zp, cur.bank, cur.dw)
        for stage in range(feed_delay(cfg)):
            feed_d = Signal(len(feed), name=f"feed_{stage}")
            m.d.sync += feed_d.eq(feed)
            feed = feed_d
        m.d.comb += Cat(self.feed_pad, self.feed_zp, self.feed_bank, self.feed_dw).eq(feed)

        # Tag pipeline (tags[i] holds the tag of the word issued in cycle f in f + 1 + i): that
        # word's accumulator is read in cycle f + written - acc_read_latency and written in
        # f + written, when its sums leave the array; the block RAM has it in f + latency.
        latency = drain_cycles(cfg) - 1
        written = latency - acc_write_latency(cfg)
        # (last of its MATMUL, kept, address, pool_max, first, issued): a word that is not
        # kept (depthwise streaming) writes nothing but is in flight like any other.
        tag = Cat(last, keep, acc_addr, cur.pool_max, cur.first, running)
        tags = []
        for stage in range(latency):
            tag_d = Signal(len(tag), name=f"tag_{stage}")
            m.d.sync += tag_d.eq(tag)
            tags.append(tag_d)
            tag = tag_d
        read_tag = tags[written - 1 - acc_read_latency(cfg)]
        write_tag = tags[written - 1]
        # The write's selects, one register per column (from the stage before).
        addr_bits = slice(2, 2 + cfg.acc_addr_bits)
        before = tags[written - 2]
        selects = replicate(m, Cat(before[-2], before[-3]), 1 if cfg.compact else cfg.cols,
                            "acc_select")
        m.d.comb += [
            self.acc_raddr.eq(read_tag[addr_bits]),
            self.acc_we.eq(write_tag[1]),
            self.acc_waddr.eq(write_tag[addr_bits]),
            self.acc_first.eq(per_lane(selects, cfg.cols, 0)),
            self.acc_max.eq(per_lane(selects, cfg.cols, 1)),
        ]
        with m.If(tags[latency - 1][0]):         # a MATMUL's last word is in the block RAM
            m.d.sync += self.completed.eq(self.completed + 1)
        # A word in the tag pipeline, in a register: the OR of the stages that will hold one
        # in the next cycle (the OR in front of ``drained`` led the 87 MHz board build's
        # critical path into the dispatcher); the same OR of the stages that hold one now in
        # the compact datapath (the UP5K has no logic cell to spare).
        in_flight = Signal()
        if cfg.compact:
            m.d.comb += in_flight.eq(Cat(t[-1] for t in tags[:latency]).any())
        else:
            m.d.sync += in_flight.eq(Cat(running, *(t[-1] for t in tags[:latency - 1])).any())
        m.d.comb += [
            self.pending.eq(pend_valid),
            self.drained.eq(~pend_valid & ~running & ~in_flight),
        ]

        # A bank stays busy until its last activation has passed the last column.
        # ``hold == 0`` in a register of its own (``held_out``), set as the count steps, so
        # that no compare of the counter sits in the dispatcher's decision.
        hold_init = bank_release(cfg) - 1
        for b in range(2):
            hold = Signal(range(hold_init + 1), name=f"hold_{b}")
            held_out = Signal(init=1, name=f"hold_{b}_done")
            with m.If(last & (cur.bank == b)):
                m.d.sync += [hold.eq(hold_init), held_out.eq(hold_init == 0)]
            with m.Elif(hold != 0):
                m.d.sync += [hold.eq(hold - 1), held_out.eq(hold == 1)]
            m.d.comb += self.bank_free[b].eq(
                ~(running & (cur.bank == b)) & ~(pend_valid & (pend.bank == b)) & held_out)
        return m
