"""The cycle model (``compiler/timing.py``): the instruction queue's fill, back-to-back
tiles, the array's throughput bound and the dispatcher's accept rules."""

import dataclasses

import pytest

from hwonnx.compiler import Op, lower, predict
from hwonnx.config import ArchConfig

from compiler_helpers import CONFIGS, chain


# cycle model --------------------------------------------------------------------------------

END = dict(op=Op.END)


def matmul(bank, count):
    return dict(op=Op.MATMUL, bank=bank, count=count, wait=0)


def loadw(bank):
    return dict(op=Op.LOADW, bank=bank)


def test_end_only_program_takes_three_cycles():
    """The instruction queue fills from a read at ``start`` (cycle 0), on the program memory's
    port from its output register in cycle 2, captured: END leaves in cycle 3 (2 in the
    compact datapath, whose program memory has no output register)."""
    for config in CONFIGS:
        timing = predict([END], config)
        assert timing.total == 3 and timing.dispatch == [3]
    timing = predict([END], dataclasses.replace(CONFIGS[0], mul_stages=1))
    assert timing.total == 2 and timing.dispatch == [2]


def matmul_stream(tiles, count):
    return [matmul(i % 2, count) for i in range(tiles)] + [END]


def lowered_stream(tiles, count):
    """The order ``lower`` emits: two loads ahead, then a load after each MATMUL."""
    program = [loadw(0)] + ([loadw(1)] if tiles > 1 else [])
    for i in range(tiles):
        program.append(matmul(i % 2, count))
        if 1 <= i < tiles - 1:
            program.append(loadw((i + 1) % 2))
    return program + [END]


@pytest.mark.parametrize("config", CONFIGS[:3], ids=lambda c: c.name)
@pytest.mark.parametrize("stream", [matmul_stream, lowered_stream])
def test_back_to_back_tiles_keep_the_array_busy(config, stream):
    # (with loads, a one-tile program skips the second prefetch: count from two tiles)
    first = 1 if stream is matmul_stream else 2
    for count in (config.rows + config.cols + 2, 50, 300):
        totals = [predict(stream(k, count), config).total for k in range(first, 8)]
        assert all(b - a == count for a, b in zip(totals, totals[1:])), (count, totals)
        timing = predict(stream(6, count), config)
        done = [d for d, i in zip(timing.done, stream(6, count)) if i["op"] == Op.MATMUL]
        assert all(b - a == count for a, b in zip(done, done[1:]))
        assert totals[0] > count                 # fill and drain are not free


def test_prediction_is_bounded_by_the_array_throughput():
    config = ArchConfig(rows=4, cols=4)
    program = lower(chain(), config)
    total = predict(program.expanded(), config).total
    fed = sum(i["count"] for i in program.expanded() if i["op"] == Op.MATMUL)
    assert total > fed
    assert program.macs <= total * config.rows * config.cols


def test_eltw_accept_rules():
    """ELTW after a MATMUL waits for the feeder to drain; with ``wait`` it also waits for the
    post-processor; a POST is queued until the MATMULs before it drain, and waits for the
    engine; the next ELTW runs beside that POST; END
    waits for the engine. (Cycle numbers worked out by hand from docs/architecture.md.)"""
    # drain = 3 + array_latency + 1 + 1 = 3 + (4 + 4 + 3) + 1 + 1 (the activation read and its
    # two registers, skew and flow, the multiply's operand, middle and product registers, the
    # accumulator write and the register the sum waits in before the block RAM takes it);
    # post latency 14 (accumulator read, its data registered, bias, the multiply's five
    # stages, the rounding shift's two, zero point, the clamp's flags and choice, activation
    # table, then the write)
    config = ArchConfig(rows=4, cols=4)
    eltw = dict(op=Op.ELTW, count=3)
    post = dict(op=Op.POST, count=3, nw=1)
    program = [matmul(0, 5), post, dict(eltw, wait=1), post, eltw, post, eltw, END]
    timing = predict(program, config)
    # (the first instruction leaves in cycle 3: the instruction queue fills from a read at
    # start through the program memory's output register; every engine takes what is
    # dispatched in t in t + 1, the hand-off)
    # MATMUL dispatched 3, taken 4, starts 5, issues 6..10: drained 10 + 16 = 26
    # POST dispatched 4 into its slot, leaves it at 26, taken 27: idle at 27 + 1 + 14 + 3 = 45
    # ELTW (wait) at 45, taken 46: idle 46 + 1 + 6 + 8 = 61 (from its last B read, the
    # activation buffer's two cycles through the output registers and 6 stages)
    # POST at 61: idle 80; ELTW at 62 (beside the POST): idle 77; POST at 80: idle 99
    # ELTW at 81 (no wait): idle 96; END at 99
    assert timing.dispatch == [3, 4, 45, 61, 62, 80, 81, 99]
    assert timing.done[2] == 60 and timing.total == 99
    assert predict([dict(eltw, count=1), END], config).total == 3 + 1 + 1 + 2 + 8


def test_post_waits_in_its_slot_while_the_next_tile_issues():
    """A POST is accepted at once and starts when the MATMULs before it have drained; the
    next MATMUL issues during that drain; a second POST is accepted only once the first has
    finished. (By hand from docs/architecture.md, Queued POST.)"""
    config = ArchConfig(rows=4, cols=4)      # drain 3 + (4 + 4 + 3) + 1 + 1, post latency 14
    post = dict(op=Op.POST, count=3, nw=1)
    timing = predict([matmul(0, 5), post, matmul(1, 5), post, END], config)
    # MATMUL 1 dispatched 3 (the instruction queue fills from a read at start through the
    # program memory's output register), taken 4 (the hand-off) into the feeder's slot:
    # starts 5, issues 6..10, drained 10 + 16 = 26.
    # POST dispatched 4, leaves its slot at 26, taken 27: idle 27 + 1 + 14 + 3 = 45.
    # MATMUL 3: dispatched 6 (the feeder's slot empties as MATMUL 1 starts, in 5), starts
    # at 10 (the first one's last issue), issues 11..15, drained 31.
    # POST accepted at 45 (the first POST done), starts 45: idle 64. END at 64.
    assert timing.dispatch == [3, 4, 6, 45, 64]
    assert timing.done[1] == 44 and timing.total == 64


def test_unknown_opcode_is_a_bug():
    with pytest.raises(ValueError, match=r"^Unknown opcode 12$"):
        predict([dict(op=12), END], ArchConfig())
    for op in ("LOADX", "LOADP"):
        with pytest.raises(ValueError, match=rf"^{op}, but the 8x8 architecture has no external"):
            predict([dict(op=getattr(Op, op), count=1), END], ArchConfig())
    external = ArchConfig(ext_memory="ulx3s-sdram", ext_depth=1024)
    for op in ("LOADA", "STOREA"):              # an external memory, but no staging buffers
        for config in (ArchConfig(), external):
            with pytest.raises(ValueError, match=rf"^{op}, but the 8x8 architecture has no "
                                                 rf"staging buffers"):
                predict([dict(op=getattr(Op, op), count=1), END], config)
