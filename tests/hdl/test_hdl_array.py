"""SystolicArray: every activation word's ``cols`` sums equal ``act @ W[bank]`` (int32) exactly
``array_latency`` cycles after the word is presented, with both weight banks in use and one
bank rewritten while the other streams."""

import dataclasses

import numpy as np
import pytest

from hwonnx.hdl import SystolicArray, array_latency
from hwonnx.hdl.array import psum_width

from hdl_helpers import run_cycles, small_config

GEOMETRIES = [(1, 1), (2, 3), (3, 2), (4, 4)]


def int8(rng, *shape):
    return rng.integers(-128, 128, shape, dtype=np.int64)


def simulate(config, loads, feeds, cycles):
    """``loads``: cycle -> (bank, row, int8 weights[cols]); ``feeds``: cycle -> (bank,
    int8 act[rows][, depthwise]). Returns the ``sums`` seen in every cycle ([cycles, cols]
    int64)."""
    dut = SystolicArray(config)
    seen = np.zeros((cycles, config.cols), dtype=np.int64)

    def step(ctx, cycle):
        if cycle in loads:
            bank, row, weights = loads[cycle]
            ctx.set(dut.wload_en, 1)
            ctx.set(dut.wload_bank, bank)
            ctx.set(dut.wload_row, row)
            ctx.set(dut.wload_data, [int(w) for w in weights])
        else:
            ctx.set(dut.wload_en, 0)
        bank, act, *dw = feeds.get(cycle, (0, np.zeros(config.rows, dtype=np.int64)))
        ctx.set(dut.feed_dw, dw[0] if dw else 0)
        ctx.set(dut.feed_bank, bank)
        ctx.set(dut.feed, [int(a) for a in act])
        seen[cycle] = list(ctx.get(dut.sums))

    run_cycles(dut, cycles, step)
    return seen


def load_tile(loads, start, bank, weights):
    """One row per cycle from ``start`` (row ``r`` in cycle ``start + r``)."""
    for r, row in enumerate(weights):
        loads[start + r] = (bank, r, row)


def check(config, feeds, weights_of, seen):
    latency = array_latency(config)
    for cycle, (bank, act) in sorted(feeds.items()):
        expected = act @ weights_of(cycle, bank)
        np.testing.assert_array_equal(seen[cycle + latency], expected,
                                      err_msg=f"word presented in cycle {cycle}, bank {bank}")


@pytest.mark.parametrize("mul_stages, middle", [(1, 0), (5, 1)], ids=["compact", "pipelined"])
@pytest.mark.parametrize("rows, cols", GEOMETRIES)
def test_array_latency_is_rows_plus_cols_plus_two_or_three(rows, cols, mul_stages, middle):
    """By hand: lane ``r`` of a word presented in cycle ``t`` leaves the ``r`` skew registers
    in cycle ``t + r`` and is in PE ``(r, c)``'s activation register in cycle ``t + r + c + 1``;
    with its weight in the operand registers in ``t + r + c + 2``, (in the pipelined datapath
    the multiply's middle register in ``t + r + c + 3``, so ``m = 1``, else ``m = 0``), its
    product in the product register in ``t + r + c + m + 3`` and the partial sum of row ``r``
    in ``t + r + c + m + 4`` (it meets the partial sum of row ``r - 1``, there since
    ``t + r + c + m + 3``). Column ``c`` leaves the bottom row in ``t + rows + c + m + 3`` and
    the ``cols - 1 - c`` de-skew registers in ``t + rows + cols + m + 2``."""
    config = dataclasses.replace(small_config(rows, cols), mul_stages=mul_stages)
    assert array_latency(config) == rows + cols + middle + 2
    # One word, then nothing: the sums are zero in every cycle but the documented one.
    rng = np.random.default_rng(rows * 10 + cols)
    w = int8(rng, rows, cols)
    loads = {}
    load_tile(loads, 0, 0, w)
    act = int8(rng, rows)
    seen = simulate(config, loads, {rows: (0, act)}, rows + 2 * (rows + cols) + 3)
    expected = np.zeros_like(seen)
    expected[rows + rows + cols + middle + 2] = act @ w
    np.testing.assert_array_equal(seen, expected)


@pytest.mark.parametrize("rows, cols", GEOMETRIES)
def test_array_alternating_banks_matches_numpy(rows, cols):
    config = small_config(rows, cols)
    rng = np.random.default_rng(100 + rows * 10 + cols)
    w = [int8(rng, rows, cols), int8(rng, rows, cols)]
    # Extreme weights and activations in the first words: -128 * -128 * rows must not wrap.
    w[0][0] = -128
    w[1][-1] = 127
    loads = {}
    load_tile(loads, 0, 0, w[0])
    load_tile(loads, rows, 1, w[1])
    first, count = 2 * rows, 24
    feeds = {first + i: (i % 2, int8(rng, rows)) for i in range(count)}
    feeds[first] = (0, np.full(rows, -128))
    feeds[first + 1] = (1, np.full(rows, 127))
    seen = simulate(config, loads, feeds, first + count + array_latency(config) + 1)
    check(config, feeds, lambda cycle, bank: w[bank], seen)


@pytest.mark.parametrize("rows, cols", GEOMETRIES)
def test_array_rewrites_one_bank_while_the_other_streams(rows, cols):
    """Bank 1 is rewritten row by row while bank-0 words keep streaming, one per cycle. The
    rewrite starts as early as the old bank-1 words allow (row ``r`` is written once the last
    old word has left row ``r``: ``cols`` cycles after it was presented), and new bank-1 words
    follow as early as the skew allows (with the write of row 0)."""
    config = small_config(rows, cols)
    rng = np.random.default_rng(200 + rows * 10 + cols)
    w0, w1_old, w1_new = (int8(rng, rows, cols) for _ in range(3))
    loads = {}
    load_tile(loads, 0, 0, w0)
    load_tile(loads, rows, 1, w1_old)
    first = 2 * rows
    feeds = {}
    cycle = first
    for i in range(10):                     # phase 1: both banks, old bank 1
        feeds[cycle] = (i % 2, int8(rng, rows))
        cycle += 1
    last_old = max(c for c, (bank, _) in feeds.items() if bank == 1)
    rewrite = last_old + cols
    load_tile(loads, rewrite, 1, w1_new)
    while cycle < rewrite:                  # bank 0 only while bank 1 drains
        feeds[cycle] = (0, int8(rng, rows))
        cycle += 1
    for i in range(rows + 10):              # overlapping the rewrite: new bank 1 in use
        feeds[cycle] = ((i + 1) % 2, int8(rng, rows))
        cycle += 1
    assert feeds[rewrite][0] == 1
    seen = simulate(config, loads, feeds, cycle + array_latency(config) + 1)

    def weights_of(cycle, bank):
        if bank == 0:
            return w0
        return w1_old if cycle <= last_old else w1_new

    check(config, feeds, weights_of, seen)


@pytest.mark.parametrize("rows, cols", [(1, 1), (2, 3), (3, 3), (4, 4), (3, 5)])
def test_array_depthwise_streaming(rows, cols):
    """``feed_dw``: column ``c < rows`` of the word presented in cycle ``f`` sums
    ``W[r][c] * word[f + r][c]`` (a 1-D convolution of lane ``c`` along the stream); the other
    columns, and words before and after the stream (normal mode, the other bank), are
    unchanged."""
    config = small_config(rows, cols)
    rng = np.random.default_rng(200 + rows * 10 + cols)
    w = [int8(rng, rows, cols), int8(rng, rows, cols)]
    loads = {}
    load_tile(loads, 0, 0, w[0])
    load_tile(loads, rows, 1, w[1])
    start, length = 2 * rows + 1, 9
    words = int8(rng, length + 2, rows)
    feeds = {start - 1: (1, words[0])}                                  # normal, bank 1
    feeds.update({start + i: (0, words[1 + i], 1) for i in range(length)})
    feeds[start + length] = (1, words[length + 1])                      # normal again
    seen = simulate(config, loads, feeds, start + length + 2 * (rows + cols) + 4)
    latency = array_latency(config)
    for cycle, (bank, act, *dw) in feeds.items():
        expected = act @ w[bank]
        if dw:
            i = cycle - start + 1                                       # index into words
            for c in range(min(rows, cols)):
                expected[c] = sum(int(w[bank][r][c]) * int(words[i + r][c])
                                  if i + r < len(words) else 0 for r in range(rows))
        np.testing.assert_array_equal(seen[cycle + latency], expected,
                                      err_msg=f"word of cycle {cycle} (depthwise: {bool(dw)})")


def test_psum_width_holds_every_sum_of_its_row_and_no_less():
    """Row ``r`` adds ``r + 1`` products, each in ``[-128 * 127, (-128) ** 2]``: the signed
    width holds both ends, and one bit less does not hold the top."""
    for row in range(64):
        width = psum_width(row)
        low, high = -128 * 127 * (row + 1), 128 * 128 * (row + 1)
        assert -(1 << width - 1) <= low and high <= (1 << width - 1) - 1, row
        assert high > (1 << width - 2) - 1, row


@pytest.mark.parametrize("rows, cols", [(1, 2), (3, 2), (16, 2)])
def test_array_sums_at_both_ends_of_their_range(rows, cols):
    """Every weight -128 (bank 0) or 127 (bank 1) against words of -128 and 127: the column
    sums reach ``rows * 16384`` and ``-rows * 16256``, the ends of the narrowed partial sums,
    and come out as int32 without wrapping."""
    config = small_config(rows, cols)
    w = [np.full((rows, cols), -128, dtype=np.int64), np.full((rows, cols), 127, dtype=np.int64)]
    loads = {}
    load_tile(loads, 0, 0, w[0])
    load_tile(loads, rows, 1, w[1])
    first = 2 * rows
    words = [(0, -128), (1, -128), (0, 127), (1, 127)]
    feeds = {first + i: (bank, np.full(rows, value, dtype=np.int64))
             for i, (bank, value) in enumerate(words)}
    seen = simulate(config, loads, feeds, first + len(words) + array_latency(config) + 1)
    check(config, feeds, lambda cycle, bank: w[bank], seen)
    latency = array_latency(config)
    assert seen[first + latency][0] == rows * 16384
    assert seen[first + 1 + latency][0] == -rows * 16256
