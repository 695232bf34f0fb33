"""PostProcessor: bit-exact against ``hwonnx.golden.requantize`` (and ``lookup`` for the
activation tables), lane routing of output tiles that straddle activation words (``nw > 1``,
``lane_off > 0``), byte enables, write timing (``post_latency``) and the ``idle`` timing the
cycle model relies on."""

import dataclasses

import numpy as np
import pytest
from amaranth.hdl import Module, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from hwonnx.config import ArchConfig
from hwonnx.isa import Op
from hwonnx.golden import requantize
from hwonnx.golden.ops import lookup
from hwonnx.hdl.bram import REGISTERED_READ_LATENCY
from hwonnx.hdl.post import POST_LATENCY, PostProcessor, post_latency

from hdl_helpers import SyncReadMemory, run_cycles, set_instr, small_config
from helpers import raises

INT32 = (-(1 << 31), 1 << 31)


def random_params(rng, cols, kind):
    """Per-channel (bias, mult, shift) for one parameter word."""
    mult = rng.integers(1 << 30, 1 << 31, cols)
    if kind == "ties":          # (v * 2**30) >> 32 rounds v / 4: exact halves when v % 4 == 2
        return 2 * rng.integers(-20, 20, cols), np.full(cols, 1 << 30), np.full(cols, 32)
    bias = rng.integers(*INT32, cols)               # acc + bias wraps about a quarter of the time
    shift = rng.integers(54, 64, cols)              # mostly in the non-saturating range
    shift[rng.random(cols) < 0.3] = rng.integers(1, 64)
    if kind == "wide":          # channels 0 and 1 are used by every tile of >= 2 channels
        shift[:2] = [63, 1][:cols]
        bias[0], mult[0] = 0, (1 << 31) - 1                 # extreme products
    else:
        shift[0], shift[-1] = 1, 63
    return bias, mult, shift


def tile_instr(config, n0, nt, n_out, count, acc_addr, par_addr, base, zp, lo, hi):
    """The POST of output channels ``n0 .. n0+nt`` of an ``n_out``-channel layer whose output
    starts at word ``base``, built like ``TileEmitter.layer``: pixels are ``cb`` words apart,
    and consecutive tiles share the word where one ends and the next begins."""
    rows = config.rows
    nw = (n0 + nt - 1) // rows - n0 // rows + 1
    return dict(op=Op.POST, acc_addr=acc_addr, count=count, par_addr=par_addr,
                out_addr=base + n0 // rows, out_stride=-(-n_out // rows),
                nw=nw, lane_off=n0 % rows, nt=nt, zp=zp, lo=lo, hi=hi)


def expected_writes(config, instr, y):
    """Per step (accumulator word i, activation word j, pass g of ``post_passes``):
    (address, lane mask, lane values); pass g writes the channels its requantizers hold,
    ``g * post_lanes`` to ``(g + 1) * post_lanes``."""
    rows, width = config.rows, config.post_lanes_used
    steps = []
    for i in range(instr["count"]):
        for j in range(instr["nw"]):
            for g in range(config.post_passes):
                mask, lanes = 0, [None] * rows
                for lane in range(rows):
                    channel = j * rows + lane - instr["lane_off"]
                    if 0 <= channel < instr["nt"] and channel // width == g:
                        mask |= 1 << lane
                        lanes[lane] = int(y[i, channel])
                steps.append((instr["out_addr"] + i * instr["out_stride"] + j, mask, lanes))
    return steps


def run_post(config, instrs, acc, params, act_init, tables=()):
    """Dispatch ``instrs`` back to back (each in the cycle ``idle`` is predicted to rise) and
    check every cycle's ``idle`` and write port; returns the activation memory afterwards.
    ``tables`` are the activation tables' initial contents (``lut`` of an instruction)."""
    rows = config.rows
    latency = post_latency(config)

    def steps(instr):
        return instr["count"] * instr["nw"] * config.post_passes
    dut = PostProcessor(config, [v & 0xFF for table in tables for v in table])
    # both buffers read through the block RAM's output register (hdl/bram.py)
    acc_mem = SyncReadMemory([[int(v) for v in word] for word in acc], dut.acc_addr,
                             dut.acc_data, latency=REGISTERED_READ_LATENCY)
    par_words = [[{"bias": int(b), "mult": int(m), "shift": int(s)} for b, m, s in zip(*p)]
                 for p in params]
    par_mem = SyncReadMemory(par_words, dut.par.addr, dut.par.data, en=dut.par.en,
                             latency=REGISTERED_READ_LATENCY)

    # The cycle model: dispatch in cycle t -> writes in t+1+L .. t+L+n, idle at t+1+L+n, with
    # L = post_latency(config), n = count*nw*post_passes.
    dispatch, writes, t = {}, {}, 1
    for instr in instrs:
        bias, mult, shift = (np.asarray(a) for a in params[instr["par_addr"]])
        nt = instr["nt"]
        words = acc[instr["acc_addr"]:instr["acc_addr"] + instr["count"], :nt]
        y = requantize(words, bias[:nt], mult[:nt], shift[:nt], instr["zp"], instr["lo"],
                       instr["hi"])
        if instr.get("lut"):
            y = lookup(y, tables[instr["lut"] - 1])
        dispatch[t] = instr
        for k, write in enumerate(expected_writes(config, instr, y)):
            writes[t + 1 + latency + k] = write
        t += 1 + latency + steps(instr)
    busy_until = {s: s + 1 + latency + steps(i) for s, i in dispatch.items()}
    act = [list(word) for word in act_init]

    def step(ctx, cycle):
        instr = dispatch.get(cycle)
        ctx.set(dut.instr.valid, instr is not None)
        if instr is not None:
            set_instr(ctx, dut.instr, instr)
        busy = any(s < cycle < e for s, e in busy_until.items())
        idle = ctx.get(dut.idle)
        assert idle == (not busy), f"idle={idle} in cycle {cycle}"
        we = ctx.get(dut.out_we)
        if cycle in writes:
            address, mask, lanes = writes[cycle]
            assert we == mask, f"out_we={we:#x} in cycle {cycle}, expected {mask:#x}"
            if mask:
                assert ctx.get(dut.out_addr) == address, f"out_addr in cycle {cycle}"
            data = list(ctx.get(dut.out_data))
            for lane in range(rows):
                if mask >> lane & 1:
                    assert data[lane] == lanes[lane], \
                        f"cycle {cycle}, word {address}: out_data {data}, expected {lanes}"
                    act[address][lane] = data[lane]
        else:
            assert we == 0, f"out_we={we:#x} in cycle {cycle}, no write expected"

    run_cycles(dut, t + 3, step, memories=(acc_mem, par_mem))
    # Reads: accumulator word i of each instruction, nw * passes times, from the cycle after
    # dispatch.
    expected_reads = [(s + 1 + k, instr["acc_addr"] + k // (steps(instr) // instr["count"]))
                      for s, instr in dispatch.items() for k in range(steps(instr))]
    assert set(expected_reads) <= set(acc_mem.reads)
    # The parameter word: read once, in the cycle after dispatch (from the instruction
    # register, not the dispatcher's decode).
    assert par_mem.reads == [(s + 1, i["par_addr"]) for s, i in dispatch.items()]
    return act


# (rows, cols, n_out): rows != cols so that output tiles straddle activation words.
GEOMETRIES = [(1, 1, 3), (3, 2, 7), (2, 3, 8), (2, 5, 9), (4, 2, 6), (4, 4, 6)]


@pytest.mark.parametrize("mul_stages", [5, 1])
@pytest.mark.parametrize("rows, cols, n_out", GEOMETRIES)
def test_post_matches_golden_requantize(rows, cols, n_out, mul_stages):
    """Random requantizations (the "wide" parameters reach int32's extremes) equal golden,
    with the multiply in five stages or in one."""
    config = dataclasses.replace(small_config(rows, cols), mul_stages=mul_stages)
    requantize_tiles(config, n_out)


# (rows, cols, post_lanes, n_out): passes of 2 to 6 requantizers' columns, output tiles that
# straddle activation words, a last tile narrower than one pass.
PASSES = [(4, 4, 2, 6), (2, 4, 1, 9), (3, 6, 2, 13), (4, 8, 4, 19), (8, 4, 2, 7), (2, 6, 3, 8)]


@pytest.mark.parametrize("rows, cols, lanes, n_out", PASSES)
def test_post_in_passes_matches_golden_requantize(rows, cols, lanes, n_out):
    """With fewer requantizers than columns (``post_lanes``), each accumulator word in
    ``cols / post_lanes`` passes, each writing the lanes of its columns: the same words as
    golden, the writes and ``idle`` when the cycle model says."""
    config = dataclasses.replace(small_config(rows, cols), post_lanes=lanes)
    assert config.post_passes == cols // lanes > 1
    requantize_tiles(config, n_out)


def test_passes_need_the_pipelined_datapath_without_ort_rounding():
    """The passes are built in the pipelined datapath's stages only; one pass is any."""
    for changes in (dict(mul_stages=1), dict(ort_rounding=True)):
        with raises(ValueError, "ArchConfig.post_lanes fewer than cols needs mul_stages 5 and "
                                "no ort_rounding"):
            ArchConfig(rows=4, cols=4, post_lanes=2, **changes)
        assert ArchConfig(rows=4, cols=4, post_lanes=4, **changes).post_passes == 1


def requantize_tiles(config, n_out):
    """The output tiles of a 4-pixel layer with ``n_out`` channels through the
    post-processor of ``config``, against golden."""
    rows, cols = config.rows, config.cols
    rng = np.random.default_rng(rows * 100 + cols * 10 + n_out)
    acc = rng.integers(*INT32, (config.acc_depth, cols))
    acc[:4] = 2 * rng.integers(-150, 150, (4, cols))      # even: v / 4 is a tie half the time
    acc[config.acc_half] = INT32[0]                        # extremes for the "wide" tiles
    acc[config.acc_half + 1] = INT32[1] - 1
    params = [random_params(rng, cols, kind) for kind in ("ties", "wide", "narrow", "wide")]
    # The output tiles of a 4-pixel layer with n_out channels, as TileEmitter.layer splits it;
    # tile 0 reads the small accumulators with the "ties" parameters.
    instrs = []
    for index, n0 in enumerate(range(0, n_out, cols)):
        zp = int(rng.integers(-20, 20))
        lo, hi = [(-128, 127), (zp, 127), (zp, 90), (-100, 60)][index % 4]   # incl. ReLU
        instrs.append(tile_instr(config, n0, min(cols, n_out - n0), n_out, 4,
                                 config.acc_half * (index % 2), index % 4, 5, zp, lo, hi))
    act_init = rng.integers(-128, 128, (config.act_depth, rows))
    act = run_post(config, instrs, acc, params, act_init)

    # Channel ch of pixel i lands in word out_addr + i*out_stride + (ch + lane_off) // rows,
    # lane (ch + lane_off) % rows; every other lane keeps its old value.
    expected = act_init.copy()
    for instr in instrs:
        bias, mult, shift = (np.asarray(a) for a in params[instr["par_addr"]])
        nt, a0 = instr["nt"], instr["acc_addr"]
        y = requantize(acc[a0:a0 + instr["count"], :nt], bias[:nt], mult[:nt], shift[:nt],
                       instr["zp"], instr["lo"], instr["hi"])
        for i in range(instr["count"]):
            for ch in range(nt):
                word, lane = divmod(ch + instr["lane_off"], rows)
                expected[instr["out_addr"] + i * instr["out_stride"] + word, lane] = y[i, ch]
    np.testing.assert_array_equal(np.array(act), expected)
    if (rows, cols) in ((3, 2), (2, 3), (2, 5)):
        assert any(i["nw"] > 1 and i["lane_off"] > 0 for i in instrs)


def test_post_latency_by_hand():
    """The stages, by hand (accumulator word read in cycle k): its data registered k+1, bias
    add k+2, the multiply's operand registers k+3, partial products k+4, their copies k+5,
    middle sum k+6, the product k+7, the rounding shift's barrel shift k+8 and rounding add
    k+9, zero point k+10, the clamp's range flags k+11 and choice k+12, write k+13: L = 13.
    With mul_stages 1, the multiply in
    k+3, the rounding shift in one stage (round_stages 1), zero point and clamp in one
    (clamp_stages 1) and the write in k+6: 6. The onnxruntime rounding unit's 4 stages
    replace the multiply and the rounding shift: 10 (8 with mul_stages 1). The activation
    table is one stage more."""
    assert POST_LATENCY == 3
    assert post_latency(small_config(3, 2)) == 13
    assert post_latency(small_config(3, 2, lut_tables=4)) == 14
    for stages, ort, lut_tables, latency in ((1, False, 0, 6), (1, False, 4, 7), (5, True, 0, 10),
                                             (5, True, 4, 11), (1, True, 4, 9)):
        config = dataclasses.replace(small_config(3, 2, lut_tables), ort_rounding=ort,
                                     mul_stages=stages)
        assert post_latency(config) == latency


@pytest.mark.parametrize("count, nw", [(1, 1), (3, 1), (2, 3), (5, 2)])
def test_post_idle_rises_14_plus_count_times_nw_after_dispatch(count, nw):
    """``run_post`` asserts ``idle`` in every cycle: low from t+1 to t+L+count*nw, high in
    t+1+L+count*nw (L = post_latency = 13 here, no activation tables: the first read in t+1,
    its write in t+1+L, the last of count*nw writes in t+L+count*nw), when the next
    instruction is dispatched."""
    config = small_config(3, 2)
    assert post_latency(config) == 13
    rng = np.random.default_rng(count * 10 + nw)
    acc = rng.integers(*INT32, (config.acc_depth, 2))
    params = [random_params(rng, 2, "wide") for _ in range(config.par_depth)]
    instr = dict(op=Op.POST, acc_addr=config.acc_half, count=count, par_addr=1, out_addr=3,
                 out_stride=nw, nw=nw, lane_off=1, nt=2, zp=-3, lo=-3, hi=127)
    run_post(config, [instr, dict(instr, par_addr=2, acc_addr=0)], acc, params,
             np.zeros((config.act_depth, 3), dtype=np.int64))


@pytest.mark.parametrize("rows, cols, tables, lanes", [(3, 2, 3, 0), (4, 4, 1, 0),
                                                      (2, 5, 15, 0), (4, 6, 2, 3)])
def test_post_activation_tables(rows, cols, tables, lanes):
    """Each value goes through table ``lut - 1`` (random tables: every entry matters), or
    passes unchanged with ``lut = 0``; the table stage is one more cycle of latency (also
    with the columns in passes, ``post_lanes``)."""
    config = dataclasses.replace(small_config(rows, cols, lut_tables=tables), post_lanes=lanes)
    assert post_latency(config) == 13 + 1
    rng = np.random.default_rng(rows * 10 + tables)
    contents = [tuple(int(v) for v in rng.integers(-128, 128, 256)) for _ in range(tables)]
    acc = rng.integers(-40000, 40000, (config.acc_depth, cols))
    params = [(rng.integers(-1000, 1000, cols), np.full(cols, 1 << 30), np.full(cols, 38))
              for _ in range(4)]        # v / 256: int8 values across the whole table
    instrs = [dict(tile_instr(config, 0, cols, cols, 6, config.acc_half * (k % 2), k % 4, 0,
                              int(rng.integers(-20, 20)), -128, 127), lut=lut)
              for k, lut in enumerate([tables, 0, 1, tables // 2 + 1])]
    run_post(config, instrs, acc, params, np.zeros((config.act_depth, rows), dtype=np.int64),
             contents)


class _Multiply(wiring.Component):
    """The post-processor's 32x32 multiply of one lane alone."""

    def __init__(self, stages):
        self._stages = stages
        super().__init__({"v": In(signed(32)), "k": In(signed(32)), "p": Out(signed(64))})

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.p.eq(PostProcessor._multiply(m, 0, self.v, self.k, self._stages))
        return m


@pytest.mark.parametrize("stages", [5, 1])
def test_multiply_is_exact_over_all_of_int32(stages):
    """The three-multiplier (Karatsuba) multiply in five stages, and the one-stage one, equal
    ``v * k`` exactly ``stages`` cycles later, for both signs of both operands: the ends of
    int32, the halves' ends (``vl`` of 0 and 0xFFFF, ``vh`` of -2**15 and 2**15 - 1: the
    sums' ends) and random words."""
    rng = np.random.default_rng(stages)
    ends = [-(1 << 31), (1 << 31) - 1, -1, 0, 1, 0xFFFF, 0x7FFF0000, -0x80000000 + 0xFFFF,
            0x7FFFFFFF - 0xFFFF, 1 << 16, -(1 << 16)]
    pairs = [(v, k) for v in ends for k in ends]
    pairs += [tuple(int(x) for x in rng.integers(*INT32, 2)) for _ in range(300)]
    dut = _Multiply(stages)
    seen = {}

    def step(ctx, cycle):
        if cycle < len(pairs):
            ctx.set(dut.v, pairs[cycle][0])
            ctx.set(dut.k, pairs[cycle][1])
        seen[cycle] = ctx.get(dut.p)

    run_cycles(dut, len(pairs) + stages + 1, step)
    for i, (v, k) in enumerate(pairs):
        assert seen[i + stages] == v * k, (v, k)


class _Clamp(wiring.Component):
    """The post-processor's clamp of one lane alone."""

    def __init__(self):
        super().__init__({"level": In(signed(67)), "lo": In(signed(8)), "hi": In(signed(8)),
                          "y": Out(signed(8))})

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.y.eq(PostProcessor._choose(*PostProcessor._range(self.level), self.lo,
                                                    self.hi))
        return m


def test_clamp_equals_the_two_comparisons():
    """The clamp (``_range``'s flags, then ``_choose``'s 8-bit comparisons) gives what
    ``lo if level < lo else hi if level > hi else level`` gives, for levels at int8's ends
    and past them, at the 67-bit word's ends, and random ones of every magnitude, with
    bounds at int8's ends, ReLU-like ones, equal ones and crossed ones (``lo > hi``)."""
    rng = np.random.default_rng(7)
    levels = [-(1 << 66), (1 << 66) - 1, -129, -128, -127, -1, 0, 1, 126, 127, 128, 255, 256,
              -256, -257, 1 << 40, -(1 << 40) + 5]
    levels += [int(rng.integers(-(1 << 62), 1 << 62)) >> int(rng.integers(0, 62))
               for _ in range(60)]
    bounds = [(-128, 127), (0, 127), (-5, 90), (-100, 60), (3, 3), (127, 127), (-128, -128),
              (40, -40), (127, -128)]
    cases = [(v, lo, hi) for v in levels for lo, hi in bounds]
    dut = _Clamp()
    seen = []

    async def testbench(ctx):          # combinational: a value settles when it is set
        for v, lo, hi in cases:
            ctx.set(dut.level, v)
            ctx.set(dut.lo, lo)
            ctx.set(dut.hi, hi)
            seen.append(ctx.get(dut.y))

    sim = Simulator(dut)
    sim.add_testbench(testbench)
    sim.run()
    for (v, lo, hi), y in zip(cases, seen):
        assert y == (lo if v < lo else hi if v > hi else v), (v, lo, hi)
