"""Feeder: the MATMUL engine walks the im2col positions of a conv tile (checked against
``hwonnx.golden.im2col`` of an index image), one read per cycle, padding as ``feed_pad``;
instructions stream back to back; ``pending``, ``drained`` and ``bank_free`` follow the rules
of ``hwonnx/compiler/timing.py``; the accumulator tags come out ``array_latency + 1`` cycles
after each read, the accumulator read ``acc_read_latency`` cycles before its write, and no
two writes in consecutive cycles go to the same word (a MATMUL whose first word writes the
word the one before it wrote last starts a cycle later)."""

import numpy as np
import pytest

from hwonnx.isa import Op
from hwonnx.golden.im2col import conv_output_size, im2col
from hwonnx.hdl.feeder import Feeder, acc_read_latency

from hdl_helpers import run_cycles, set_instr, small_config

#: Outputs with one bit per column, all equal (hdl/fanout.py): each is checked as all ones
#: where the flag is set and all zeros where it is not.
PER_COLUMN = ("acc_first",)
OUTPUTS = ("act_en", "act_addr", "feed_pad", "feed_zp", "feed_bank", "acc_raddr", "acc_we",
           "acc_waddr", "acc_first", "pending", "drained", "bank_free")


def conv_layer(config, base, ih, iw, cb_in, kernel, strides, pads, dilations, zp):
    """The MATMUL tiles of one layer with their im2col addresses (None: padding). The field
    formulas are those of ``TileEmitter.layer`` in ``hwonnx/compiler/emitter.py``; the
    banks alternate as in ``TileEmitter.finish``."""
    (kh, kw), (sy, sx), (dy, dx) = kernel, strides, dilations
    pt, pl, pb, pr = pads
    oh = conv_output_size(ih, kh, sy, pt, pb, dy)
    ow = conv_output_size(iw, kw, sx, pl, pr, dx)
    index = np.arange(ih * iw, dtype=np.int64).reshape(1, 1, ih, iw)
    pixel = im2col(index, kernel, strides, pads, dilations, pad_value=-1)[0]   # [oh*ow, kh*kw]
    m_total, m_tile = oh * ow, min(oh * ow, config.acc_half)
    k_tiles = [(ky, kx, cb) for ky in range(kh) for kx in range(kw) for cb in range(cb_in)]
    tiles = []
    for tile, m0 in enumerate(range(0, m_total, m_tile)):
        mt = min(m_tile, m_total - m0)
        oy0, ox0 = divmod(m0, ow)
        for k_index, (ky, kx, cb) in enumerate(k_tiles):
            iy0 = oy0 * sy + ky * dy - pt
            ix0 = ox0 * sx + kx * dx - pl
            ixr = kx * dx - pl
            instr = dict(
                op=Op.MATMUL, wait=int(not tiles), first=int(k_index == 0), bank=len(tiles) % 2,
                count=mt, acc_addr=(tile % 2) * config.acc_half,
                act_addr=base + (iy0 * iw + ix0) * cb_in + cb,
                act_row=base + (iy0 * iw + ixr) * cb_in + cb,
                ow=ow, ox0=ox0, ih=ih, iw=iw, iy0=iy0, ix0=ix0, ixr=ixr, sy=sy, sx=sx,
                step_x=sx * cb_in, step_y=sy * iw * cb_in, zp=zp)
            p = pixel[m0:m0 + mt, ky * kw + kx]
            tiles.append((instr, [None if q < 0 else base + int(q) * cb_in + cb for q in p]))
    assert max(a for _, addrs in tiles for a in addrs if a is not None) < config.act_depth
    return tiles


def schedule(instrs, t0, post_idle_from):
    """The cycle model of ``timing.py`` for MATMULs only (no depthwise streaming): each is
    dispatched as soon as the pending slot is free; one whose first word writes the
    accumulator word the one before wrote last does not start back to back with it; returns
    (dispatch, start, feed_end); reads are start+1 .. feed_end."""
    times, t, pending_free, feed_end, written = [], t0, 0, 0, None
    for instr in instrs:
        t = max(t, pending_free)
        start = max(t + 1, feed_end + (instr["acc_addr"] == written),
                    post_idle_from if instr["wait"] else 0)
        pending_free, feed_end = start + 1, start + instr["count"]
        written = instr["acc_addr"] + instr["count"] - 1
        times.append((t, start, feed_end))
        t += 1
    return times


def run_feeder(config, tiles, t0=2, post_idle_from=0):
    rows, cols = config.rows, config.cols
    instrs = [instr for instr, _ in tiles]
    times = schedule(instrs, t0, post_idle_from)
    cycles = times[-1][2] + rows + cols + 10      # a few cycles drained at the end
    dut = Feeder(config)
    dispatch = {t: instr for (t, _, _), instr in zip(times, instrs)}
    seen = {name: np.zeros(cycles, dtype=np.int64) for name in OUTPUTS}

    def step(ctx, cycle):
        instr = dispatch.get(cycle)
        ctx.set(dut.post_idle, cycle >= post_idle_from)
        ctx.set(dut.instr.valid, instr is not None)
        if instr is not None:
            set_instr(ctx, dut.instr, instr)
        for name in OUTPUTS:
            seen[name][cycle] = ctx.get(getattr(dut, name))

    run_cycles(dut, cycles, step)

    # Expected per cycle; None where the output is a don't care.
    want = {name: [None] * cycles for name in OUTPUTS}
    want["act_en"] = [0] * cycles
    want["acc_we"] = [0] * cycles
    want["pending"] = [0] * cycles
    drained, bank_free = [1] * cycles, [[1] * cycles, [1] * cycles]
    # By hand: a word read in cycle f is on the array's feed in f + 3 (the buffer's read,
    # then two registers, as many as the weight loader's write delay); its sums are on the
    # array output array_latency = rows + cols + 3 cycles later (skew and flow rows + cols,
    # plus the operand, middle and product registers of the multiply), in
    # f + rows + cols + 6, when the accumulator word read three cycles before is written. The
    # feeder is drained two cycles after the last word's write (the sum waits a cycle in the
    # accumulators' register before the block RAM takes it): feed_end + rows + cols + 8.
    latency = rows + cols + 6               # read -> accumulator write
    for (t, start, feed_end), (instr, addrs) in zip(times, tiles):
        assert len(addrs) == instr["count"] == feed_end - start
        for cycle in range(t + 1, start + 1):
            want["pending"][cycle] = 1
        for cycle in range(t + 1, feed_end + rows + cols + 8):
            drained[cycle] = 0
        for cycle in range(t + 1, feed_end + max(cols - 1, 1)):
            bank_free[instr["bank"]][cycle] = 0
        for i, addr in enumerate(addrs):
            f = start + 1 + i
            want["act_en"][f] = int(addr is not None)
            want["act_addr"][f] = addr
            want["feed_pad"][f + 3] = int(addr is None)
            want["feed_zp"][f + 3] = instr["zp"]
            want["feed_bank"][f + 3] = instr["bank"]
            want["acc_raddr"][f + latency - acc_read_latency(config)] = instr["acc_addr"] + i
            want["acc_we"][f + latency] = 1
            want["acc_waddr"][f + latency] = instr["acc_addr"] + i
            want["acc_first"][f + latency] = instr["first"]
    want["drained"] = drained
    assert not any(want["acc_we"][c - 1] and want["acc_we"][c] and want["acc_waddr"][c - 1]
                   == want["acc_waddr"][c] for c in range(1, cycles))
    want["bank_free"] = [a | b << 1 for a, b in zip(*bank_free)]
    for name in OUTPUTS:
        cycles_checked = [c for c in range(cycles) if want[name][c] is not None]
        full = (1 << dut.config.cols) - 1 if name in PER_COLUMN else 1
        expected = [want[name][c] * full for c in cycles_checked]
        got = [int(seen[name][c]) for c in cycles_checked]
        assert got == expected, (name, [(c, g, e) for c, g, e in
                                        zip(cycles_checked, got, expected) if g != e][:8])
    return times


# (rows, cols), (base, ih, iw, cb_in, kernel, strides, pads, dilations, zp)
CASES = [
    ((3, 2), (3, 4, 5, 2, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), -7)),    # 3 m-tiles, ox0 != 0
    ((2, 3), (0, 5, 6, 1, (3, 3), (2, 2), (1, 0, 2, 1), (1, 2), 5)),     # strided, dilated
    ((2, 5), (1, 3, 3, 3, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 0)),     # mostly padding
    ((4, 4), (10, 5, 5, 1, (2, 2), (2, 2), (0, 0, 1, 1), (1, 1), 127)),  # last tile: 1 pixel
    ((1, 1), (6, 1, 1, 5, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), -128)),  # dense: count 1
]
CASE_IDS = ["3x2-pad", "2x3-strided-dilated", "2x5-mostly-pad", "4x4-ragged", "1x1-dense"]


@pytest.mark.parametrize("geometry, conv", CASES, ids=CASE_IDS)
def test_feeder_single_tile(geometry, conv):
    """One tile: the first read is in cycle t+2, then one position per cycle; drained at
    feed_end + rows + cols + 8 (array_latency + 5: drain_cycles) and the bank free at
    feed_end + max(cols - 1, 1)."""
    config = small_config(*geometry)
    tiles = conv_layer(config, *conv)
    for index in (0, len(tiles) - 1):
        (t, start, feed_end), = run_feeder(config, [tiles[index]], t0=3)
        assert (t, start + 1) == (3, 3 + 2)


@pytest.mark.parametrize("geometry, conv", CASES, ids=CASE_IDS)
def test_feeder_layer_back_to_back(geometry, conv):
    """Every tile of a layer, each dispatched as soon as ``pending`` is low: the reads of
    consecutive tiles follow each other with no gap, except behind a one-word tile, which the
    single pending slot cannot keep up with: one cycle (3 of the 5 layers have such tiles)."""
    config = small_config(*geometry)
    tiles = conv_layer(config, *conv)
    times = run_feeder(config, tiles)
    gaps = [b[1] - a[2] for a, b in zip(times, times[1:])]
    assert gaps == [0 if instr["count"] > 1 else 1 for instr, _ in tiles[:-1]]


@pytest.mark.parametrize("waits", [(1, 0, 1), (0, 0, 1)])
@pytest.mark.parametrize("post_idle_from", [2, 15, 30])
def test_feeder_wait_starts_when_post_idle(waits, post_idle_from):
    """A tile with ``wait`` starts (first read one cycle later) only once the post-processor
    is idle, and stays pending meanwhile; a tile without it starts regardless."""
    config = small_config(3, 2)
    tiles = conv_layer(config, 3, 4, 5, 2, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 0)[:3]
    tiles = [(dict(instr, wait=wait), addrs) for (instr, addrs), wait in zip(tiles, waits)]
    times = run_feeder(config, tiles, t0=2, post_idle_from=post_idle_from)
    feed_end = 0
    for (t, start, end), wait in zip(times, waits):
        assert start == max(t + 1, feed_end, post_idle_from if wait else 0)
        feed_end = end
    if not waits[0]:
        assert times[0][1] + 1 == 2 + 2


def test_a_tile_that_writes_the_word_written_just_before_waits_a_cycle():
    """A two-word tile's last word and a one-word tile's word write the same accumulator word:
    the second tile starts a cycle after the first issues its last word instead of in that
    cycle, so its read (``acc_read_latency`` before its write) sees the first write
    (run_feeder checks every output cycle by cycle). A one-word tile that writes another word
    follows back to back."""
    config = small_config(2, 2)
    base = conv_layer(config, 0, 1, 2, 1, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 0)
    (first, addrs), = base
    assert first["count"] == 2
    second = dict(first, count=1, acc_addr=first["acc_addr"] + 1, first=0, wait=0,
                  act_addr=addrs[1], act_row=addrs[0], ox0=1, ix0=1, bank=1)
    times = run_feeder(config, [(first, addrs), (second, addrs[1:])])
    assert times[1][1] == times[0][2] + 1
    other = dict(second, acc_addr=first["acc_addr"])
    times = run_feeder(config, [(first, addrs), (other, addrs[1:])])
    assert times[1][1] == times[0][2]
