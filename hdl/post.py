"""The POST engine: requantizes accumulators into int8 activations."""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..config import ArchConfig
from .dsp import MULT_LATENCY, RegisteredMultiplier
from .fanout import held
from .layouts import InstrLayout, ParamLayout, buffer_read, instr_stream
from .rounding import ORT_LATENCY, OrtRounder

__all__ = ["PostProcessor", "POST_LATENCY", "WIDE_MULT_BLOCKS", "SHIFTED_BITS", "round_stages",
           "clamp_stages", "post_latency", "narrow_shift", "round_narrow", "funnel"]

#: Cycles from an accumulator read to the write of its activation word besides the multiply's
#: (``ArchConfig.mul_stages``), the rounding shift's and the clamp's: accumulator read, its data
#: registered, bias add (then the write).
POST_LATENCY = 3

#: 18x18 multipliers of one lane's 32x32 multiply in five stages (``mul_stages`` 5: Karatsuba,
#: :meth:`PostProcessor._multiply`).
WIDE_MULT_BLOCKS = 3


#: Bits of the rounding shift's result ``p >> (shift - 1)`` that the post-processor keeps, with
#: a flag for a result outside them (:func:`narrow_shift`). Ten are enough: a result outside
#: them rounds to at least ``2**8`` in magnitude (:func:`round_narrow`), which any int8 zero
#: point leaves outside int8 on the same side, so the clamp gives what the whole 64-bit result
#: gives (proved for every product, shift, zero point and clamp, and that nine are not:
#: ``tests/formal/test_formal_post.py``). The 64-bit barrel shifter, rounding add and zero-point
#: add took 582 LUT4 and 67 adder cells in every column (a 16x16 post-processor: 12.0k LUT4
#: and 2.7k adder cells, a fifth of a ULX3S-85F; with this and :meth:`PostProcessor._placement`
#: 8.6k and 1.6k).
SHIFTED_BITS = 10


def funnel(m: Module, items: list, amount: Value, width: int, name: str) -> list:
    """``items[amount:amount + width]`` (``amount`` unsigned), as a barrel shifter that only
    carries what the remaining stages can still move into the result (the largest step first);
    past the end of ``items`` its last item (an arithmetic shift's sign). Items are values of
    one width. Each stage is one word (a signal per item and stage was a third of the 8x8
    accelerator's processes in Verilator, and its post-processor took 28% of the simulation's
    time); the logic is the same multiplexer per item."""
    size = len(Value.cast(items[0]))
    current, count = Cat(*items), len(items)
    for b in reversed(range(len(amount))):
        step, kept = 1 << b, width + (1 << b) - 1
        last = current[(count - 1) * size:count * size]
        padded = Cat(current, *[last] * max(0, kept + step - count))
        moved = Signal(kept * size, name=f"{name}_{b}")
        m.d.comb += moved.eq(Mux(amount[b], padded[step * size:(step + kept) * size],
                                 padded[:kept * size]))
        current, count = moved, kept
    return [current[i * size:(i + 1) * size] for i in range(width)]


def narrow_shift(m: Module, p: Value, amount: Value, name: str,
                 width: int = SHIFTED_BITS) -> "tuple[Value, Value]":
    """``(h, outside)``: ``h`` is ``p >> amount`` (``p`` signed 64-bit, ``amount`` 6 bits) in
    ``width`` signed bits, exact when ``outside`` is low; ``outside`` is high when the whole
    shift is not in those bits (a bit of ``p`` at or above ``amount + width - 1`` differs from
    its sign). The test reads ``p``'s bits in windows of 16 chosen by
    ``amount``'s top two bits: the bits above the window, and those of the window at or above
    the low four bits of ``amount``."""
    h = Signal(signed(width), name=f"{name}_h")
    m.d.comb += h.eq(Cat(*funnel(m, [p[i] for i in range(64)], amount, width, name)))
    sign = p[63]
    differs = [p[i] ^ sign for i in range(63)] + [Const(0)] * 48
    window, fine = amount[4:6], amount[:4]
    above = Signal(name=f"{name}_above")
    with m.Switch(window):
        for k in range(4):
            with m.Case(k):
                m.d.comb += above.eq(Cat(*differs[16 * k + width + 15:63]).any()
                                     if 16 * k + width + 15 < 63 else 0)
    inside_window = []
    for j in range(16):
        bit = Signal(name=f"{name}_w{j}")
        with m.Switch(window):
            for k in range(4):
                with m.Case(k):
                    m.d.comb += bit.eq(differs[16 * k + width - 1 + j])
        inside_window.append(bit & (fine <= j))
    outside = Signal(name=f"{name}_outside")
    m.d.comb += outside.eq(above | Cat(*inside_window).any())
    return h, outside


def round_narrow(h: Value, outside: Value, negative: Value) -> Value:
    """The rounding step after :func:`narrow_shift` (``((p >> (s - 1)) + 1) >> 1``): from
    ``h`` when inside, else ``2**(len(h) - 2)`` with ``p``'s sign (``negative``), which any
    int8 zero point leaves outside int8 (``len(h)`` at least :data:`SHIFTED_BITS`)."""
    far = 1 << (len(h) - 2)
    return Mux(outside, Mux(negative, -far, far), (h + 1) >> 1)


def round_stages(config: ArchConfig) -> int:
    """Stages of the rounding shift: the shift by ``shift - 1`` (:func:`narrow_shift`), then
    the rounding add and the last shift; both in one on the smallest devices (``mul_stages``
    1), whose slow clock does not need the flip-flops a column more."""
    return 1 if config.compact else 2


def clamp_stages(config: ArchConfig) -> int:
    """Stages of the zero point and the clamp: the zero-point add, the range flags
    (:meth:`PostProcessor._range`), then the 8-bit comparisons and the choice (in one stage
    with the routing of the instruction's fields to every column, they held an ECP5 build at
    80 MHz; the flags and the choice in one, at 93 MHz); all in one on the smallest devices
    (``mul_stages`` 1)."""
    return 1 if config.compact else 3


def post_latency(config: ArchConfig) -> int:
    """:data:`POST_LATENCY` plus the multiply's ``mul_stages`` and the rounding shift's
    :func:`round_stages` (with the onnxruntime rounding unit, its
    :data:`~hwonnx.hdl.rounding.ORT_LATENCY` stages instead of both), the clamp's
    :func:`clamp_stages`, plus one with activation tables."""
    core = ORT_LATENCY if config.ort_rounding else config.mul_stages + round_stages(config)
    return POST_LATENCY + core + clamp_stages(config) + (1 if config.lut_tables else 0)


class PostProcessor(wiring.Component):
    """For each accumulator word ``i`` and each of ``nw`` activation words ``j``:
    ``v = wrap32(acc + bias)``, ``y = clamp(((v * mult + 2**(shift-1)) >> shift) + zp, lo, hi)``
    per channel (see ``hwonnx.golden.requantize``), then lane ``l`` of activation word
    ``out_addr + i * out_stride + j`` receives channel ``j * rows + l - lane_off`` when that is
    in ``[0, nt)``; other lanes are left unwritten (byte enables).

    Pipeline: read accumulator (cycle k), register its data (k+1), add bias (k+2), multiply
    (``mul_stages`` 5: k+3 to k+7, its operands, the partial products, again, their middle
    sum, the product; 1: k+3), rounding shift (the barrel shift, then the rounding add), zero
    point, the clamp's range flags and choice, select lanes and write (k+13 with five multiply
    stages). ``idle`` is high
    once every write is done. Every stage is one register-to-register path: a block-RAM read,
    one adder, the 18x18 multipliers, or the shifter (with the rounding add after it, it
    limited an ECP5 build to 81 MHz). The parameter word is read from the registered
    instruction in the cycle after dispatch (not from the dispatcher's decode: that path to
    the block RAM's enable limited an ECP5 build to 55 MHz) and copied into a register, in
    time for the first bias add. The
    block-RAM output, the adder and the 32x32 multiplier in one path limited an ECP5 build to
    31 MHz; the parameter read, the shift and the clamp after the multiplier to 36-41 MHz.

    Members
    -------
    instr : ``In(instr_stream())``: a POST to start (ready when ``idle``); ``par_addr`` is
        read in the cycle after it is taken (``par.data`` is valid two cycles after that and
        held for the whole instruction).
    idle : no step or write outstanding.
    acc_addr, acc_data : accumulator read port (the word two cycles after its address).
    par : ``Out(buffer_read(par_depth, ParamLayout(config)))``: the parameter buffer's read
        port, the word two cycles after its address
        (:class:`~hwonnx.hdl.bram.RegisteredRAM`).
    out_we, out_addr, out_data : activation-buffer write port (``out_we`` per lane).
    lut_we, lut_addr, lut_data : with ``lut_tables``: write entry ``lut_addr`` of the activation
        tables (every column's copy); ``lut_init`` gives their initial contents.

    With ``lut_tables``, a stage after the clamp looks each value ``y`` up in table
    ``lut - 1`` (entry ``256 (lut - 1) + y + 128`` of a per-column memory) when the POST's
    ``lut`` field is set, and passes it through otherwise.
    """

    def __init__(self, config: ArchConfig, lut_init: "list[int] | None" = None):
        self._config = config
        self._lut_init = list(lut_init or [])
        tables = {"lut_we": In(1), "lut_addr": In(range(config.lut_depth)),
                  "lut_data": In(8)} if config.lut_tables else {}
        super().__init__({**tables,
            "instr": In(instr_stream()),
            "idle": Out(1),
            "acc_addr": Out(config.acc_addr_bits),
            "acc_data": In(data.ArrayLayout(signed(32), config.cols)),
            "par": Out(buffer_read(config.par_depth, ParamLayout(config))),
            "out_we": Out(config.rows),
            "out_addr": Out(config.act_addr_bits),
            "out_data": Out(data.ArrayLayout(signed(8), config.rows)),
        })

    @property
    def config(self) -> ArchConfig:
        return self._config

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        rows, cols = cfg.rows, cfg.cols
        # ``lanes`` requantizers, each serving ``passes`` columns, one per cycle (the column
        # ``g * lanes + k`` in lane k in pass g): every accumulator word takes ``passes``
        # cycles per activation word.
        lanes, passes = cfg.post_lanes_used, cfg.post_passes

        cur = Signal(InstrLayout())
        active = Signal()
        remaining = Signal(16)               # accumulator words left, this one included
        acc_addr = Signal(cfg.acc_addr_bits)
        word = Signal(8)                     # j
        pix_addr = Signal(26)                # out_addr + i * out_stride
        started = Signal()                   # the cycle after dispatch: read the parameters
        take = Signal()
        m.d.comb += [self.instr.ready.eq(self.idle),
                     take.eq(self.instr.valid & self.instr.ready)]
        m.d.sync += started.eq(take)
        m.d.comb += [self.par.addr.eq(cur.par_addr), self.par.en.eq(started)]
        # The instruction is taken in every cycle the post-processor is ready (see
        # ``instr_stream``): ``valid`` drives only ``active`` and ``started``.
        instr = self.instr.payload
        # ``last``: ``word`` is the accumulator word's last (``nw - 1``), decided a cycle ahead
        # so that a register, not a compare with ``cur``, enables the counters (that compare
        # was the critical path of a ULX3S-85F build, 87.67 MHz: 11.41 ns, 8.62 routing).
        last = Signal()
        with m.If(self.idle):
            m.d.sync += [cur.eq(instr), remaining.eq(instr.count), last.eq(instr.nw == 1),
                         acc_addr.eq(instr.acc_addr), word.eq(0), pix_addr.eq(instr.out_addr)]
        # Each column's copy of the fields its lane reads (zero point, clamp, rounding mode,
        # table), so that no register of ``cur`` steers every lane.
        fields = ("zp", "lo", "hi", "rne") + (("lut",) if cfg.lut_tables else ())
        copies = held(m, instr, fields, self.idle, 1 if cfg.compact else lanes, "lane")
        own = [copies[c % len(copies)] for c in range(lanes)]
        # ``take`` needs ``idle``, which implies ``~active``: the counters step under
        # ``active`` alone, not under ``~take`` (the 82 MHz ULX3S-85F build's critical path
        # ended in ``word`` through ``take``).
        with m.If(take):
            m.d.sync += active.eq(1)
        advance = active        # the counters step: in the last pass of a step
        group = Const(0)        # the pass
        if passes > 1:
            group = Signal(range(passes), name="group")
            group_last = Signal(name="group_last")
            with m.If(self.idle):
                m.d.sync += [group.eq(0), group_last.eq(0)]
            with m.If(active):
                m.d.sync += [group.eq(Mux(group_last, 0, group + 1)),
                             group_last.eq(~group_last & (group == passes - 2))]
            advance = active & group_last
        with m.If(advance):
            with m.If(last):
                m.d.sync += [word.eq(0), acc_addr.eq(acc_addr + 1), remaining.eq(remaining - 1),
                             pix_addr.eq(pix_addr + cur.out_stride), last.eq(cur.nw == 1)]
                with m.If(remaining == 1):
                    m.d.sync += active.eq(0)
            with m.Else():
                m.d.sync += [word.eq(word + 1), last.eq(word + 2 == cur.nw)]
        m.d.comb += self.acc_addr.eq(acc_addr)

        # Each stage carries (valid, word address, channel of lane 0) along with its data,
        # and with more than one pass the pass (``groups``, by stage).
        stages, groups = [], {}

        def stage(name, valid, addr, base):
            regs = (Signal(name=f"{name}_valid"), Signal(26, name=f"{name}_addr"),
                    Signal(signed(18), name=f"{name}_base"))
            m.d.sync += [regs[0].eq(valid), regs[1].eq(addr), regs[2].eq(base)]
            stages.append(regs)
            if passes > 1:          # the first stage's from the counter
                after = Signal.like(group, name=f"{name}_group")
                m.d.sync += after.eq(groups.get(id(valid), group))
                groups[id(regs[0])] = after
            return regs

        def pass_of(regs):
            """The pass of the word in stage ``regs``."""
            return groups[id(regs[0])] if passes > 1 else Const(0)

        def column(values, regs):
            """Per lane, the item of ``values`` (one per column) of its column in the pass
            of the word in stage ``regs``."""
            if passes == 1:
                return list(values)
            chosen = pass_of(regs)
            return [Array(values[g * lanes + k] for g in range(passes))[chosen]
                    for k in range(lanes)]

        # The parameter word, from the buffer's output register
        # (:class:`~hwonnx.hdl.bram.RegisteredRAM`): read in cycle t + 1 (dispatch in t), on
        # par.data from t + 3, the cycle of the first bias add (the first accumulator read is
        # in t + 1).
        par = self.par.data

        # Stage 1: the accumulator word in the buffer's output register (``acc_data``, two
        # cycles after its address).
        first_base = word * rows - cur.lane_off
        if passes > 1:          # lane 0 holds column group * lanes
            first_base = first_base - group * lanes
        s1_valid, s1_addr, s1_base = stage("s1", active, pix_addr + word, first_base)
        acc = self.acc_data
        # Stage 2: add the bias.
        sa_valid, sa_addr, sa_base = sa = stage("sa", s1_valid, s1_addr, s1_base)
        sb_valid, sb_addr, sb_base = sb = stage("sb", sa_valid, sa_addr, sa_base)
        biased = [Signal(signed(32), name=f"biased_{c}") for c in range(lanes)]
        lane_acc = column(list(acc), sa)
        lane_bias = column([par[c].bias for c in range(cols)], sa)
        for c in range(lanes):
            # int32 wrap-around, as in the golden model's accumulator.
            m.d.sync += biased[c].eq((lane_acc[c] + lane_bias[c])[:32])

        values = [Signal(signed(8), name=f"value_{c}") for c in range(lanes)]
        # The level before the clamp: the rounding unit's, or the narrow rounding shift's
        # (SHIFTED_BITS, then the rounding) plus the int8 zero point.
        level_shape = signed(67 if cfg.ort_rounding else SHIFTED_BITS + 1)
        levels = [Signal(level_shape, name=f"level_{c}") for c in range(lanes)]
        valids = [s1_valid, sa_valid, sb_valid]
        if cfg.ort_rounding:
            # Stages 3 to 6: the rounding unit, in either rounding (``rne``), instead of the
            # multiply and the rounding shift.
            chain = (sb_valid, sb_addr, sb_base)
            for i in range(ORT_LATENCY):
                chain = stage(f"r{i}", *chain)
                valids.append(chain[0])
            for c in range(lanes):      # (one pass: ArchConfig.post_lanes)
                m.submodules[f"round_{c}"] = rounder = OrtRounder()
                m.d.comb += [rounder.v.eq(biased[c]), rounder.even.eq(own[c].rne),
                             rounder.mult.eq(par[c].mult),
                             rounder.shift.eq(par[c].shift),
                             levels[c].eq(rounder.y + own[c].zp)]
        else:
            # Stages 3 to 2 + mul_stages: the multiply. Then the rounding shift (round_stages).
            split = round_stages(cfg) == 2
            chain = (sb_valid, sb_addr, sb_base)
            named = {}
            for name in ("m0", "m1", "m2", "m3")[:cfg.mul_stages - 1] + ("s2",) + \
                    ("sh",) * split + ("sr",):
                chain = named[name] = stage(name, *chain)
                valids.append(chain[0])
            # The multiplier's operands in the cycle after the bias add, the shift in the
            # product's (post_latency_by_hand in tests/hdl/test_hdl_post.py).
            lane_mult = column([par[c].mult for c in range(cols)], sb)
            lane_shift = column([par[c].shift for c in range(cols)], named["s2"])
            products = [self._multiply(m, c, biased[c], lane_mult[c], cfg.mul_stages)
                        for c in range(lanes)]
            for c in range(lanes):
                # round(p / 2**s) half up == ((p >> (s - 1)) + 1) >> 1 for s >= 1, in
                # SHIFTED_BITS bits and a flag (narrow_shift).
                shifted, outside = narrow_shift(m, products[c], (lane_shift[c] - 1)[:6],
                                                f"shift_{c}")
                halved = Signal(signed(SHIFTED_BITS), name=f"halved_{c}")
                halved_out = Signal(name=f"halved_{c}_outside")
                halved_neg = Signal(name=f"halved_{c}_negative")
                shifting = [halved.eq(shifted), halved_out.eq(outside),
                            halved_neg.eq(products[c][-1])]
                if split:
                    m.d.sync += shifting
                else:
                    m.d.comb += shifting
                rounded = Signal(signed(SHIFTED_BITS), name=f"rounded_{c}")
                m.d.sync += rounded.eq(round_narrow(halved, halved_out, halved_neg))
                m.d.comb += levels[c].eq(rounded + own[c].zp)

        # Then (after the rounding shift or the rounding unit): zero point, clamp
        # (clamp_stages: the zero-point add, the range flags and the choice each in a stage
        # of their own, or all in one).
        ranges = [self._range(level) for level in levels]
        if clamp_stages(cfg) == 3:
            chain = stage("sz", *chain)
            valids.append(chain[0])
            for c in range(lanes):
                level = Signal(level_shape, name=f"level_reg_{c}")
                m.d.sync += level.eq(levels[c])
                ranges[c] = self._range(level)
            chain = stage("sf", *chain)
            valids.append(chain[0])
            for c in range(lanes):
                flags = (Signal(name=f"inside_{c}"), Signal(signed(8), name=f"low_{c}"),
                         Signal(name=f"negative_{c}"))
                m.d.sync += [f.eq(v) for f, v in zip(flags, ranges[c])]
                ranges[c] = flags
        assert stages[-1] is chain
        nt = cur.nt
        if passes > 1:          # the channels of the pass, from group * lanes: in the limit's
            nt = cur.nt - pass_of(stages[-3]) * lanes   # register a stage before the base's
        placed = self._placement(m, stages[-2][2], nt)
        s3_valid, s3_addr, s3_base = stage("s3", *chain)
        valids.append(s3_valid)
        for c in range(lanes):
            m.d.sync += values[c].eq(self._choose(*ranges[c], own[c].lo, own[c].hi))

        if cfg.lut_tables:
            # After the clamp: the activation table.
            s3_valid, s3_addr, s3_base = self._tables(m, own, values, (s3_valid, s3_addr,
                                                                       s3_base))
            valids.append(s3_valid)
            later = [Signal.like(reg, name=f"{reg.name}_4") for reg in placed]
            m.d.sync += [reg.eq(value) for reg, value in zip(later, placed)]
            placed = later

        # Last stage: route channels to lanes and write. Lane l takes channel base + l, the
        # values shifted by base (funnel: rows - 1 empty entries on each side), where that
        # channel is in [0, min(nt, cols)): lanes first to end.
        amount, first, end = placed
        blank = [Const(0, signed(8))] * (rows - 1)
        moved = funnel(m, blank + values + blank, amount, rows, "lanes")
        m.d.comb += self.out_addr.eq(s3_addr[:cfg.act_addr_bits])
        for lane in range(rows):
            m.d.comb += [self.out_data[lane].eq(moved[lane]),
                         self.out_we[lane].eq(s3_valid & (first <= lane) & (lane < end))]
        # ``idle`` (no step running, no stage holding a word) in a register, set from what the
        # stages hold now: they shift, ``valids[0]`` taking ``active``; so it is the
        # dispatcher's status from a flip-flop (the OR over the stages sat in its accept).
        # In the compact datapath the OR itself (the UP5K has no logic cell to spare).
        if cfg.compact:
            m.d.comb += self.idle.eq(~active & ~Cat(*valids).any())
        else:
            idle = Signal(init=1)
            m.d.sync += idle.eq(~take & ~active & ~Cat(*valids[:-1]).any())
            m.d.comb += self.idle.eq(idle)
        return m

    def _placement(self, m, base, nt):
        """``(amount, first, end)`` in registers, two stages after the one whose channel of
        lane 0 is ``base``: the lanes' shift of the values (``base + rows - 1``) and the
        lanes written, ``first`` to ``end``, those whose channel ``base + lane`` lies in
        ``[0, min(nt, lanes))`` (``lanes``: the requantizers, ``ArchConfig.post_lanes``;
        ``nt`` and ``base`` less the pass's first column). Each lane's 18-bit channel add,
        three compares and 16-way choice took 2,211 LUT4 and 372 CCU2C of a 16x16
        post-processor (ECP5; this, 596 and 40). The differences in one stage, their clamps in
        the next (from ``cur`` through ``nt``'s compare, the subtraction and the clamp was the
        critical path of a ULX3S-85F build at 93.8 MHz: 10.66 ns); ``min(nt, lanes)`` in a
        register of its own, a stage earlier: ``nt`` is the instruction's, less the pass's
        first column of the word a stage before ``base``'s."""
        rows, cols = self.config.rows, self.config.post_lanes_used

        def lanes(x):
            return Mux(x <= 0, 0, Mux(x >= rows, rows, x))
        limit = Signal(range(-cols if self.config.post_passes > 1 else 0, cols + 1),
                       name="place_limit")
        m.d.sync += limit.eq(Mux(nt < cols, nt, cols))
        shift = Signal(signed(19), name="place_shift")
        before = Signal(signed(19), name="place_before")
        rest = Signal(signed(20), name="place_rest")
        m.d.sync += [shift.eq(base + rows - 1), before.eq(-base), rest.eq(limit - base)]
        amount = Signal((cols + rows - 2).bit_length() or 1, name="place_amount")
        first = Signal(range(rows + 1), name="place_first")
        end = Signal(range(rows + 1), name="place_end")
        m.d.sync += [amount.eq(shift), first.eq(lanes(before)), end.eq(lanes(rest))]
        return amount, first, end

    @staticmethod
    def _range(level):
        """``(inside, low, negative)`` of a level: whether it lies in int8 (its bits above the
        seventh all equal to its sign), its low 8 bits, its sign: a clamp to int8 bounds
        without a comparison over the whole word (:meth:`_choose`)."""
        top = level[7:]
        return ~top.any() | top.all(), level[:8].as_signed(), level[-1]

    @staticmethod
    def _choose(inside, low, negative, lo, hi):
        """``clamp(level, lo, hi)`` for int8 ``lo``, ``hi`` from :meth:`_range`'s flags: a
        level outside int8 becomes ``lo`` when negative and ``hi`` when positive (what the two
        comparisons give for any int8 ``lo``, ``hi``); one inside is compared in 8 bits. The
        two 67-bit comparisons were carry chains through the word and limited an ECP5 build
        to 91 MHz; the flags and the choice in one stage, to 93."""
        return Mux(inside, Mux(low < lo, lo, Mux(low > hi, hi, low)), Mux(negative, lo, hi))

    @staticmethod
    def _multiply(m, c, v, k, stages):
        """``v * k`` (both signed 32-bit) in ``stages`` registered stages (``mul_stages``):
        one, or five, with :data:`WIDE_MULT_BLOCKS` multipliers (Karatsuba): with
        ``v = vh 2**16 + vl`` and ``k = kh 2**16 + kl`` (``vl``, ``kl`` unsigned), the products
        ``vl kl``, ``vh kh`` and ``(vh + vl)(kh + kl)`` (each sum in ``[-2**15, 98302]``: 18
        bits), each a :class:`~hwonnx.hdl.dsp.RegisteredMultiplier` (its operands, then its
        product: one MULT18X18D with its own registers on ECP5), then the products again in
        logic (so that the register out of the block can sit beside it); then the middle term
        ``vl kh + vh kl = (vh + vl)(kh + kl) - vl kl - vh kh``; then ``vh kh 2**32 + vl kl``
        (a concatenation: ``0 <= vl kl < 2**32``) plus the middle term times ``2**16``. Three
        multipliers instead of the four partial products leave a 16x16 array 16 more DSP blocks
        on a ULX3S-85F. In one stage the multipliers, their routing to the fabric and the
        adders limited an ECP5 build to 58 MHz; with the multipliers combinational between
        registers in logic, the routing into and out of them to 74-86 MHz. Returns the
        product's register."""
        product = Signal(signed(64), name=f"product_{c}")
        if stages == 1:
            m.d.sync += product.eq(v * k)
            return product
        assert MULT_LATENCY == 2
        vl, vh, kl, kh = v[:16], v[16:32].as_signed(), k[:16], k[16:32].as_signed()
        parts = []
        for name, x, y, width in (("ll", vl, kl, 17), ("hh", vh, kh, 17),
                                  ("ss", vh + vl, kh + kl, 18)):
            m.submodules[f"mul_{name}_{c}"] = mul = RegisteredMultiplier(width, width)
            again = Signal(signed(2 * width), name=f"pp_{name}_{c}_d")
            m.d.comb += [mul.a.eq(x), mul.b.eq(y)]      # unsigned halves: zero-extended
            m.d.sync += again.eq(mul.p)
            parts.append(again)
        ll, hh, ss = parts
        middle = Signal(signed(34), name=f"pp_mid_{c}")   # |vl kh + vh kl| < 2**32
        outer = Signal(signed(64), name=f"pp_outer_{c}")
        m.d.sync += [middle.eq((ss - ll - hh)[:34].as_signed()),
                     outer.eq(Cat(ll[:32], hh[:32]))]
        m.d.sync += product.eq(outer + (middle << 16))
        return product

    def _tables(self, m, own, values, chain):
        """Look ``values`` up in activation table ``own[c].lut - 1`` (one memory per column,
        all written together); replaces ``values`` in place by the stage's outputs and returns
        the stage's (valid, addr, base)."""
        cfg = self.config
        index_bits = max(1, (cfg.lut_tables - 1).bit_length())
        regs = (Signal(name="s4_valid"), Signal(26, name="s4_addr"),
                Signal(signed(18), name="s4_base"))
        m.d.sync += [r.eq(v) for r, v in zip(regs, chain)]
        for c, value in enumerate(values):
            mem = Memory(shape=unsigned(8), depth=cfg.lut_depth, init=self._lut_init)
            m.submodules[f"lut_{c}"] = mem
            write, read = mem.write_port(), mem.read_port()
            # entry 256 t + y + 128: y + 128 is y with its sign bit inverted
            m.d.comb += [write.addr.eq(self.lut_addr), write.data.eq(self.lut_data),
                         write.en.eq(self.lut_we),
                         read.addr.eq(Cat(value[:7], ~value[7], (own[c].lut - 1)[:index_bits]))]
            passed = Signal(signed(8), name=f"passed_{c}")
            looked = Signal(signed(8), name=f"looked_{c}")
            m.d.sync += passed.eq(value)
            m.d.comb += looked.eq(Mux(own[c].lut != 0, read.data.as_signed(), passed))
            values[c] = looked
        return regs
