"""TileWalker: the micro-instructions it issues for SETMM, SETPOST and LOOP are, field by field
and in order, those of the reference expansion :func:`hwonnx.compiler.loops.expand`, for
random loop nests (M, N, K1, K2, K3 each 1 to 3, every weight packing, last-tile counts and
``nt``, negative steps, lane carries), taken every cycle or with random stalls, several
layers back to back; ``decoded`` is the offer as the ISA decodes it in every cycle ``valid``
is high; with ``ready`` held high one micro-instruction leaves per cycle, the first in the cycle
after the LOOP is taken; templates on offer during a walk are not taken; ``start`` drops a
walk. The testbench joins the walker to a stored-instruction stream as ``hdl/top.py`` does:
the offer is the walker's while its ``valid`` is high, the stored one otherwise."""

import numpy as np
import pytest
from hypothesis import Phase, given, seed, settings
from hypothesis import strategies as st

from hwonnx.compiler.loops import expand, normalized
from hwonnx.hdl.loader import WEIGHT_PACKINGS
from hwonnx.hdl.walker import TileWalker
from hwonnx.isa import FIELDS, Op, decode, encode

from hdl_helpers import decoded_value, run_cycles, small_config

GEOMETRIES = [(1, 1), (3, 2), (4, 4)]
FIELD = {f.name: f for f in FIELDS}


def _any(rng, name):
    """A random value over the whole range of instruction field ``name``."""
    f = FIELD[name]
    return int(rng.integers(f.min, f.max + 1))


def random_layer(rng, config, shape, wpack):
    """``(SETMM, SETPOST, LOOP)`` of nest ``shape`` (M, N, K1, K2, K3): the fields the walker
    only copies over their whole range, the ones it steps from values and steps that keep
    every micro-instruction within its field."""
    rows, cols = config.rows, config.cols
    setmm = {f.name: _any(rng, f.name) for f in FIELDS}
    setmm.update(op=Op.SETMM, wpack=wpack, wgt_addr=int(rng.integers(0, 1000)),
                 act_addr=int(rng.integers(-(1 << 20), 1 << 20)),
                 iy0=int(rng.integers(-(1 << 14), 1 << 14)),
                 ix0=int(rng.integers(-(1 << 14), 1 << 14)))
    setpost = {f.name: _any(rng, f.name) for f in FIELDS}
    setpost.update(op=Op.SETPOST, par_addr=int(rng.integers(0, 1 << 15)),
                   out_addr=int(rng.integers(0, 1 << 22)), lane_off=int(rng.integers(rows)),
                   nt=int(rng.integers(1, cols + 1)))
    m, n, k1, k2, k3 = shape

    def step(bits):
        return int(rng.integers(-(1 << bits), 1 << bits))
    loop = dict(op=Op.LOOP, bank=int(rng.integers(2)), acc=int(rng.integers(2)),
                m_count=m, n_count=n, k1=k1, k2=k2, k3=k3, w1=_any(rng, "wgt_addr"),
                count_last=_any(rng, "count"), post_count_last=_any(rng, "count"),
                nt_last=int(rng.integers(1, cols + 1)),
                act_k3=step(12), act_k2=step(12), act_k1=step(12), act_n=step(12),
                act_m=step(12), iy_k1=step(10), iy_m=step(10), ix_k2=step(10), ix_k1=step(10),
                par_n=int(rng.integers(256)), word_n=int(rng.integers(1 << 10)),
                lane_n=int(rng.integers(rows)), out_m=int(rng.integers(1 << 16)))
    return setmm, setpost, loop


def simulate(config, layers, ready, start_at=None):
    """Offer the stored program (each layer's SETMM, SETPOST, LOOP) to the walker as
    ``hdl/top.py`` does, taking the offer in the cycles ``ready(cycle)`` says. Returns the
    instructions taken, ``(cycle, "stored" | "walker", fields)``, and the cycles the walker's
    ``valid`` was high. ``start_at(taken)``: whether to raise ``start`` in a cycle after
    ``taken`` instructions were taken (the walk in progress is dropped)."""
    dut = TileWalker(config)
    program = [instr for layer in layers for instr in layer]
    taken, valid_cycles, position = [], [], [0]

    def step(ctx, cycle):
        restart = start_at is not None and start_at(len(taken))
        take = bool(ready(cycle)) and not restart
        walking = ctx.get(dut.instr.valid)
        stored = program[position[0]] if position[0] < len(program) else None
        ctx.set(dut.start, restart)
        ctx.set(dut.word_valid, stored is not None)
        ctx.set(dut.word, encode(**stored) if stored is not None else 0)
        ctx.set(dut.instr.ready, take)
        ctx.set(dut.load, take and not walking and stored is not None)
        if walking:
            valid_cycles.append(cycle)
            word = ctx.get(dut.instr.payload.as_value())
            fields = decode(word)
            assert ctx.get(dut.decoded.as_value()) == decoded_value(word), \
                f"decoded, cycle {cycle}"
            if take:
                taken.append((cycle, "walker", fields))
        elif stored is not None and take:
            taken.append((cycle, "stored", normalized(stored)))
            position[0] += 1

    micro = sum(2 * i["m_count"] * i["n_count"] * (i["k1"] * i["k2"] * i["k3"] + 1)
                for i in program if i["op"] == Op.LOOP)     # at least what a walk issues
    cycles = 40 + 8 * (len(program) + micro)
    run_cycles(dut, cycles, step)
    assert position[0] == len(program), "the program was not taken to its end"
    return taken, valid_cycles


def expected(config, layers):
    """The instructions a dispatcher takes: each layer's three, then its expansion."""
    return [fields for layer in layers
            for fields in [normalized(i) for i in layer] + [normalized(i) for i in
                                                            expand(*layer, config)]]


def check_sequence(taken, want):
    got = [fields for _, _, fields in taken]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, (f"instruction {i}: " + ", ".join(
            f"{k} {g[k]} != {w[k]}" for k in w if g[k] != w[k]))
    assert len(got) == len(want)


shapes = st.tuples(*[st.integers(1, 3)] * 5)


# Seeded, no example database: the same cases on every run; no shrinking (a failing case is
# small already, and shrinking one took minutes).
@seed(0x37)
@settings(max_examples=30, deadline=None, database=None,
          phases=(Phase.explicit, Phase.generate))
@given(geometry=st.sampled_from(GEOMETRIES), shapes=st.lists(shapes, min_size=2, max_size=2),
       packings=st.lists(st.sampled_from(WEIGHT_PACKINGS), min_size=2, max_size=2),
       stall=st.sampled_from([0.0, 0.5]), data_seed=st.integers(0, 2**32 - 1))
def test_walker_issues_the_reference_expansion(geometry, shapes, packings, stall, data_seed):
    """Two layers back to back, their micro-instructions taken every cycle (``stall`` 0) or
    with random stalls: the sequence is SETMM, SETPOST, LOOP, ``expand``'s list, for each."""
    config = small_config(*geometry)
    rng = np.random.default_rng(data_seed)
    layers = [random_layer(rng, config, shape, wpack) for shape, wpack in zip(shapes, packings)]
    stalls = np.random.default_rng(data_seed + 1).random(100_000) < stall
    taken, valid_cycles = simulate(config, layers, lambda cycle: not stalls[cycle])
    check_sequence(taken, expected(config, layers))
    walker = [cycle for cycle, source, _ in taken if source == "walker"]
    assert set(walker) <= set(valid_cycles)
    if stall == 0:
        # one instruction per cycle from the first, stored or micro: the walker's first in the
        # cycle after its LOOP, the next stored one in the cycle after its last
        first = taken[0][0]
        assert [cycle for cycle, _, _ in taken] == list(range(first, first + len(taken)))
        assert valid_cycles == walker


@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 1), (2, 1, 1, 1, 1), (1, 3, 1, 1, 1),
                                   (1, 1, 2, 1, 1), (1, 1, 1, 2, 1), (1, 1, 1, 1, 3),
                                   (2, 2, 2, 2, 2)])
def test_each_level_alone(shape):
    """Each loop level counted alone (and a single tile: one LOADW, MATMUL, POST), 3x2 array,
    taken every cycle."""
    config = small_config(3, 2)
    rng = np.random.default_rng(sum(shape))
    layer = random_layer(rng, config, shape, 1)
    taken, _ = simulate(config, [layer], lambda cycle: True)
    check_sequence(taken, expected(config, [layer]))
    if shape == (1, 1, 1, 1, 1):
        assert [fields["op"] for _, _, fields in taken[3:]] == [Op.LOADW, Op.MATMUL, Op.POST]


@pytest.mark.parametrize("after", [0, 1, 5])
def test_start_drops_a_walk(after):
    """``start`` raised once ``after`` micro-instructions of a 2x2x2 walk were taken: the
    walker's ``valid`` is low from the next cycle, and the next layer (its own templates and
    LOOP) is expanded in full from its first tile."""
    config = small_config(3, 2)
    rng = np.random.default_rng(after)
    first, second = (random_layer(rng, config, (2, 2, 2, 1, 1), 0) for _ in range(2))
    cut = 3 + after
    raised = []

    def start_at(count):
        if count == cut and not raised:
            raised.append(count)
            return True
        return False

    taken, valid_cycles = simulate(config, [first, second], lambda cycle: True, start_at)
    check_sequence(taken, expected(config, [first])[:cut] + expected(config, [second]))
    drop = taken[cut - 1][0] + 1            # the cycle start is raised in
    assert drop + 1 not in valid_cycles and taken[cut][0] > drop


def test_templates_are_kept_for_the_next_loop():
    """A second LOOP with no SETMM or SETPOST before it walks from the templates kept."""
    config = small_config(4, 4)
    rng = np.random.default_rng(11)
    setmm, setpost, loop = random_layer(rng, config, (2, 1, 1, 2, 1), 2)
    _, _, again = random_layer(rng, config, (1, 2, 2, 1, 1), 2)
    taken, _ = simulate(config, [(setmm, setpost, loop), (again,)],
                        lambda cycle: cycle % 4 != 1)
    check_sequence(taken, expected(config, [(setmm, setpost, loop)]) + [normalized(again)]
                   + [normalized(i) for i in expand(setmm, setpost, again, config)])
