"""The tile walker: expands a looped layer (SETMM, SETPOST, LOOP) into the LOADW, MATMUL and
POST micro-instructions the engines execute, one per dispatch."""

from types import SimpleNamespace

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, enum, wiring
from amaranth.lib.wiring import In, Out

from ..isa import Op, instruction_width
from ..config import ArchConfig
from .layouts import DecodedLayout, InstrLayout, LoopLayout, decoded, instr_stream
from .loader import WEIGHT_PACKINGS, tile_words

__all__ = ["TileWalker"]


class _Phase(enum.Enum, shape=2):
    LOAD1 = 0     # LOADW of tile 1 (tile 0's is made by the LOOP itself)
    MATMUL = 1
    LOADW = 2     # LOADW of the tile after the MATMUL just issued
    POST = 3


class TileWalker(wiring.Component):
    """Holds the templates of SETMM and SETPOST and, from a LOOP, issues the layer's
    micro-instructions on the stream ``instr``, the next one in the cycle after the
    dispatcher takes one, so that they leave as fast as stored ones would. The offer comes
    from two registers (a FIFO of two micro-instructions): the walk writes the next one in
    every cycle one is free, stepping its state, and the dispatcher takes the oldest, so no
    path runs from the walker's counters through the dispatcher into an engine (the 83 MHz
    board build's critical path), nor from the dispatcher's decision into the enables of the
    walk's registers (the 69 MHz KWS build's). While no walk runs, the templates and the
    start of a walk (tile 0's LOADW among them) are taken from the stored instruction on
    offer in every cycle; taking a LOOP then only marks the walk as started.

    The rules are those of :func:`hwonnx.compiler.loops.expand`, state for state: a MATMUL
    tile ``(m, n, k1, k2, k3)`` moves its weight address by a tile's words per tile
    (:func:`~hwonnx.hdl.loader.tile_words` of the template's packing; back to the template's
    at a new M tile), its activation address, ``iy0`` and ``ix0`` by the LOOP's
    step of the level that advances, and alternates its weight bank and, per output tile, its
    accumulator half; a POST moves its parameter address and output word and lane per N tile
    and its output address per M tile.

    Members
    -------
    start : ``In(1)``: the program starts over (a walk in progress is dropped).
    load : ``In(1)``: the dispatcher takes the stored instruction ``word`` (a LOOP starts the
        walk).
    word, word_valid : ``In(instruction width)``, ``In(1)``: the stored instruction on offer
        (SETMM and SETPOST are taken as templates while it is valid and no walk runs).
    instr : ``Out(instr_stream())``: ``valid`` while a walk has micro-instructions to issue.
    decoded : ``Out(DecodedLayout())``: the instruction on offer decoded
        (:func:`~hwonnx.hdl.layouts.decoded`), and ``valid``, both from registers (the
        dispatcher's decision starts from them).
    """

    def __init__(self, config: ArchConfig):
        self._config = config
        super().__init__({"start": In(1), "load": In(1), "word": In(instruction_width()),
                          "word_valid": In(1),
                          "instr": Out(instr_stream()), "decoded": Out(DecodedLayout())})

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        rows, half = cfg.rows, cfg.acc_half
        word = data.View(InstrLayout(), self.word)
        new = data.View(LoopLayout(), self.word[:LoopLayout().size])
        mm_t, po_t = Signal(InstrLayout()), Signal(InstrLayout())
        lp = Signal(LoopLayout())
        # Two micro-instructions in flight (``entries``, ``count`` of them, the oldest at
        # ``rd_ptr``): the walk writes the next one whenever one is free, the dispatcher takes
        # the oldest. While no walk runs, the templates and the walk's start are taken from
        # the stored instruction on offer in every cycle, so the dispatcher's decision
        # (``load``, ``ready``) drives only flags and pointers, never the enables of the
        # walker's wide registers (its fan-out held the 69-92 MHz board builds).
        # Each entry decoded beside it (``flags``), and ``count != 0`` in a register of its
        # own (``nonempty``): the offer's ``valid`` and ``decoded``.
        entries = [Signal(InstrLayout(), name=f"entry_{i}") for i in range(2)]
        flags = [Signal(DecodedLayout(), name=f"entry_{i}_decoded") for i in range(2)]
        wr_ptr, rd_ptr = Signal(), Signal()
        count = Signal(range(3))
        nonempty = Signal()
        more = Signal()     # the state describes a micro-instruction still to issue
        idle = Signal()
        m.d.comb += [idle.eq(~more & ~nonempty),
                     self.instr.valid.eq(nonempty),
                     self.instr.payload.eq(Mux(rd_ptr, entries[1].as_value(),
                                               entries[0].as_value())),
                     self.decoded.eq(Mux(rd_ptr, flags[1].as_value(), flags[0].as_value()))]
        with m.If(idle & self.word_valid & (word.op == Op.SETMM)):
            m.d.sync += mm_t.eq(word)
        with m.If(idle & self.word_valid & (word.op == Op.SETPOST)):
            m.d.sync += po_t.eq(word)

        phase = Signal(_Phase)
        # Each counter as wide as the LOOP field it counts to, each address as its field.
        limit = {"mi": "m_count", "ni": "n_count", "k1": "k1", "k2": "k2", "k3": "k3",
                 "pm": "m_count", "pn": "n_count"}
        loop, fields = LoopLayout(), InstrLayout()
        mi, ni, k1, k2, k3, pm, pn = (Signal(loop[limit[n]].shape, name=n) for n in
                                      ("mi", "ni", "k1", "k2", "k3", "pm", "pn"))
        first_tile, bank, acc, p_acc, post_due = (Signal(name=n) for n in
                                                  ("first_tile", "bank", "acc", "p_acc",
                                                   "post_due"))
        # Each counter's "at its last value" in a register of its own, set as the counter
        # steps (a compare of a counter with a LOOP field on the way to the offer register
        # was the 90.56 MHz board build's critical path).
        at_last = {n: Signal(name=f"{n}_at_last") for n in ("mi", "ni", "k1", "k2", "k3",
                                                            "pm", "pn")}
        wgt = Signal(fields["wgt_addr"].shape)
        act, act_mn, act_m = (Signal(fields["act_addr"].shape, name=n)
                              for n in ("act", "act_mn", "act_m"))
        iy, iy_m = (Signal(fields["iy0"].shape, name=n) for n in ("iy", "iy_m"))
        ix = Signal(fields["ix0"].shape)
        par, lane = Signal(fields["par_addr"].shape), Signal(fields["lane_off"].shape)
        out_addr, out_m = (Signal(fields["out_addr"].shape, name=n) for n in ("out_addr", "out_m"))

        with m.If(idle):       # a LOOP on offer starts from here: tile 0's LOADW is written
            single_new = ((new.m_count == 1) & (new.n_count == 1) & (new.k1 == 1)
                          & (new.k2 == 1) & (new.k3 == 1))
            first = entries[0]
            m.d.sync += [
                first.eq(0), first.op.eq(Op.LOADW), first.bank.eq(new.bank),
                flags[0].eq(0), flags[0].op.eq(1 << Op.LOADW), flags[0].bank.eq(new.bank),
                first.wgt_addr.eq(mm_t.wgt_addr), first.wpack.eq(mm_t.wpack),
                wr_ptr.eq(1), rd_ptr.eq(0), lp.eq(new),
                phase.eq(Mux(single_new, _Phase.MATMUL, _Phase.LOAD1)),
                mi.eq(0), ni.eq(0), k1.eq(0), k2.eq(0), k3.eq(0), pm.eq(0), pn.eq(0),
                *(at_last[n].eq(getattr(new, limit[n]) == 1) for n in at_last),
                first_tile.eq(1), bank.eq(new.bank), acc.eq(new.acc), p_acc.eq(new.acc),
                wgt.eq(mm_t.wgt_addr), act.eq(mm_t.act_addr), act_mn.eq(mm_t.act_addr),
                act_m.eq(mm_t.act_addr), iy.eq(mm_t.iy0), iy_m.eq(mm_t.iy0), ix.eq(mm_t.ix0),
                par.eq(po_t.par_addr), out_addr.eq(po_t.out_addr), out_m.eq(po_t.out_addr),
                lane.eq(po_t.lane_off),
            ]

        last_k = Signal()
        last_m, last_n, last_tile = Signal(), Signal(), Signal()
        m.d.comb += [
            last_k.eq(at_last["k1"] & at_last["k2"] & at_last["k3"]),
            last_m.eq(at_last["mi"]), last_n.eq(at_last["ni"]),
            last_tile.eq(last_k & last_n & last_m),
        ]

        # The micro-instruction the state describes, the next one on offer.
        out = Signal(InstrLayout())
        with m.Switch(phase):
            with m.Case(_Phase.LOADW):
                m.d.comb += [out.op.eq(Op.LOADW), out.bank.eq(bank), out.wgt_addr.eq(wgt),
                             out.wpack.eq(mm_t.wpack)]
            with m.Case(_Phase.LOAD1):
                m.d.comb += [out.op.eq(Op.LOADW), out.bank.eq(~bank), out.wgt_addr.eq(lp.w1),
                             out.wpack.eq(mm_t.wpack)]
            with m.Case(_Phase.MATMUL):
                m.d.comb += [
                    out.eq(mm_t), out.op.eq(Op.MATMUL), out.bank.eq(bank),
                    out.wait.eq(first_tile), out.first.eq((k1 == 0) & (k2 == 0) & (k3 == 0)),
                    out.count.eq(lp.count_last), out.wgt_addr.eq(wgt),
                    out.acc_addr.eq(acc * half), out.act_addr.eq(act), out.act_row.eq(act),
                    out.iy0.eq(iy), out.ix0.eq(ix), out.ixr.eq(ix),
                ]
                with m.If(~last_m):
                    m.d.comb += out.count.eq(mm_t.count)
            with m.Case(_Phase.POST):
                # nw = (lane + nt - 1) // rows + 1 (lane + nt - 1 < rows + cols - 1), for
                # both tile widths at once, then chosen
                def words(nt):
                    return 1 + sum(lane + nt - 1 >= k * rows
                                   for k in range(1, (rows + cfg.cols - 2) // rows + 1))
                at_n = at_last["pn"]
                m.d.comb += [
                    out.eq(po_t), out.op.eq(Op.POST), out.acc_addr.eq(p_acc * half),
                    out.count.eq(po_t.count), out.par_addr.eq(par), out.out_addr.eq(out_addr),
                    out.lane_off.eq(lane), out.nt.eq(Mux(at_n, lp.nt_last, po_t.nt)),
                    out.nw.eq(Mux(at_n, words(lp.nt_last), words(po_t.nt))),
                ]
                with m.If(at_last["pm"]):
                    m.d.comb += out.count.eq(lp.post_count_last)

        taken, write = Signal(), Signal()
        m.d.comb += [taken.eq(self.instr.valid & self.instr.ready),
                     write.eq(more & (count != 2))]
        # ``nonempty`` of the next cycle: one entry written, or one left after the take (of
        # two), or none taken; the dispatcher's decision (``taken``) only chooses.
        m.d.sync += [count.eq(count + write - taken),
                     nonempty.eq(write | Mux(taken, count == 2, nonempty))]
        with m.If(taken):
            m.d.sync += rd_ptr.eq(~rd_ptr)
        with m.If(self.load & (word.op == Op.LOOP)):    # taken while idle: tile 0's LOADW
            m.d.sync += [count.eq(1), nonempty.eq(1), more.eq(1)]
        with m.If(write):
            for i, entry in enumerate(entries):
                with m.If(wr_ptr == i):
                    m.d.sync += [entry.eq(out), flags[i].eq(decoded(out))]
            m.d.sync += wr_ptr.eq(~wr_ptr)
            with m.Switch(phase):
                with m.Case(_Phase.LOAD1):
                    m.d.sync += phase.eq(_Phase.MATMUL)
                with m.Case(_Phase.MATMUL):
                    self._step_matmul(m, SimpleNamespace(**locals()))
                    with m.If(~first_tile & ~last_tile):
                        m.d.sync += [phase.eq(_Phase.LOADW), post_due.eq(last_k)]
                    with m.Elif(last_k):
                        m.d.sync += phase.eq(_Phase.POST)
                with m.Case(_Phase.LOADW):
                    m.d.sync += phase.eq(Mux(post_due, _Phase.POST, _Phase.MATMUL))
                with m.Case(_Phase.POST):
                    self._step_post(m, SimpleNamespace(**locals()))
                    m.d.sync += phase.eq(_Phase.MATMUL)
                    with m.If(at_last["pm"] & at_last["pn"]):
                        m.d.sync += more.eq(0)
        with m.If(self.start):
            m.d.sync += [count.eq(0), nonempty.eq(0), more.eq(0)]
        return m

    @staticmethod
    def _counting(s):
        """Statements that step counter ``name`` (``step(name)``) or start it over
        (``restart(name)``), its ``at_last`` flag with it."""
        def step(name):
            counter, count = getattr(s, name), getattr(s.lp, s.limit[name])
            return [counter.eq(counter + 1), s.at_last[name].eq(counter == count - 2)]

        def restart(name):
            return [getattr(s, name).eq(0),
                    s.at_last[name].eq(getattr(s.lp, s.limit[name]) == 1)]
        return step, restart

    def _step_matmul(self, m, s):
        """Advance the MATMUL side to the next tile (``s``: the signals of elaborate)."""
        lp = s.lp
        step, restart = self._counting(s)
        act, act_mn, act_m, iy, iy_m, ix, wgt = s.act, s.act_mn, s.act_m, s.iy, s.iy_m, s.ix, \
            s.wgt
        m.d.sync += [s.first_tile.eq(0), s.bank.eq(~s.bank)]
        words = Signal(range(self._config.rows + 1))      # of one weight tile
        with m.Switch(s.mm_t.wpack):
            for p in WEIGHT_PACKINGS:
                with m.Case(p):
                    m.d.comb += words.eq(tile_words(self._config, p))
        with m.If(~s.last_k):
            m.d.sync += wgt.eq(wgt + words)
            with m.If(~s.at_last["k3"]):
                m.d.sync += [*step("k3"), act.eq(act + lp.act_k3)]
            with m.Elif(~s.at_last["k2"]):
                m.d.sync += [*restart("k3"), *step("k2"), act.eq(act + lp.act_k2),
                             ix.eq(ix + lp.ix_k2)]
            with m.Else():
                m.d.sync += [*restart("k3"), *restart("k2"), *step("k1"),
                             act.eq(act + lp.act_k1), iy.eq(iy + lp.iy_k1),
                             ix.eq(ix + lp.ix_k1)]
        with m.Else():
            m.d.sync += [*restart("k1"), *restart("k2"), *restart("k3"), s.acc.eq(~s.acc),
                         ix.eq(s.mm_t.ix0)]
            with m.If(~s.last_n):
                m.d.sync += [*step("ni"), wgt.eq(wgt + words), act_mn.eq(act_mn + lp.act_n),
                             act.eq(act_mn + lp.act_n), iy.eq(iy_m)]
            with m.Else():
                m.d.sync += [*restart("ni"), *step("mi"), wgt.eq(s.mm_t.wgt_addr),
                             act_m.eq(act_m + lp.act_m), act_mn.eq(act_m + lp.act_m),
                             act.eq(act_m + lp.act_m), iy_m.eq(iy_m + lp.iy_m),
                             iy.eq(iy_m + lp.iy_m)]

    def _step_post(self, m, s):
        """Advance the POST side to the next output tile."""
        lp, rows, po_t = s.lp, self._config.rows, s.po_t
        par, lane, out_addr, out_m = s.par, s.lane, s.out_addr, s.out_m
        step, restart = self._counting(s)
        m.d.sync += s.p_acc.eq(~s.p_acc)
        moved = Signal(9)
        m.d.comb += moved.eq(lane + lp.lane_n)
        with m.If(~s.at_last["pn"]):
            m.d.sync += [*step("pn"), par.eq(par + lp.par_n)]
            with m.If(moved >= rows):
                m.d.sync += [lane.eq(moved - rows), out_addr.eq(out_addr + lp.word_n + 1)]
            with m.Else():
                m.d.sync += [lane.eq(moved), out_addr.eq(out_addr + lp.word_n)]
        with m.Else():
            m.d.sync += [*restart("pn"), *step("pm"), par.eq(po_t.par_addr),
                         lane.eq(po_t.lane_off),
                         out_m.eq(out_m + lp.out_m), out_addr.eq(out_m + lp.out_m)]

