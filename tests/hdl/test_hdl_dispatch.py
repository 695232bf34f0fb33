"""Dispatcher against a Python model of its rules written from the docstrings
(``hdl/dispatch.py``: ``ACCEPT_RULES``' comments, ``hwonnx/isa.py``'s op descriptions).

Every op under every combination of the status it reads: the instruction goes out on its
engine's stream (with its word as payload) ``handoff_latency`` cycles after the cycle the op's
rule holds (the hand-off; in that cycle when 0, the compact datapath), and is taken
(``instr.ready``) exactly when that engine is ready too, or for the ops the dispatcher keeps
(POST, END, the walker's) when the rule holds; ``blocked`` is high exactly when an
instruction is on offer and not taken; ``post_idle`` is the post-processor ready with no POST
waiting or handed over. While an engine's hand-off register holds an instruction, the model
counts that engine busy. Then a random program offered with random gaps, random engine
readiness and feeder status: the model and the DUT agree in every cycle, a POST leaves its
slot in the cycle it is taken if ``mm_completed`` equals the MATMULs taken, else in the first
cycle ``mm_completed`` reaches the count of when it was taken, every instruction reaches
exactly one engine, in program order, and ``posts_done`` ignores a POST in the slot taken
after the feeder's MATMUL. With a paged program, ``boot`` gives the DMA engine the LOADP of
the first two pages."""

import dataclasses
import itertools

import numpy as np
import pytest

from hwonnx.hdl.dispatch import ACCEPT_RULES, Dispatcher, handoff_latency
from hwonnx.isa import Op, decode, encode, ext_words_per_instruction, fields_of

from hdl_helpers import decoded_value, run_cycles, small_config

ENGINE = {Op.LOADW: "loadw", Op.MATMUL: "matmul", Op.ELTW: "eltw", Op.LOADX: "dma",
          Op.LOADP: "dma", Op.LOADA: "dma", Op.STOREA: "dma"}      # others: kept
STREAMS = ("loadw", "matmul", "eltw", "dma")
PLAIN = small_config(2, 2)
COMPACT = dataclasses.replace(PLAIN, mul_stages=1)
EXT = dataclasses.replace(small_config(2, 2), ext_memory="ulx3s-sdram", ext_depth=1024,
                          prog_depth=16, prog_page=8)


def statuses(s):
    """The engines' statuses as the rules read them: an instruction in an engine's hand-off
    register (``s["held"]``: engine -> its word's fields) makes that engine busy, and a held
    MATMUL's bank not free."""
    held = s["held"]
    bank = 1 << held["matmul"]["bank"] if "matmul" in held else 0
    post_idle = s["post"] and not s["pending"] and "post" not in held
    return dict(loadw=s["loadw"] and "loadw" not in held, eltw=s["eltw"] and "eltw" not in held,
                drained=s["drained"] and "matmul" not in held, post_idle=post_idle,
                bank_free=s["bank_free"] & ~bank, dma_idle=s["dma_idle"] and "dma" not in held)


def rule(op, f, s):
    """Whether op ``op`` with fields ``f`` may leave, besides its engine's ``ready``."""
    t = statuses(s)
    return {
        Op.LOADW: lambda: t["bank_free"] >> f["bank"] & 1,
        Op.MATMUL: lambda: True,
        Op.POST: lambda: t["post_idle"] and t["eltw"],
        Op.ELTW: lambda: t["drained"] and (not f["wait"] or t["post_idle"]),
        Op.END: lambda: (t["loadw"] and t["drained"] and t["post_idle"] and t["eltw"]
                         and t["dma_idle"]),
        Op.LOADX: lambda: t["loadw"] and (t["post_idle"] or f["par_count"] == 0),
        Op.LOADP: lambda: True,
        Op.LOADA: lambda: t["drained"] and t["eltw"],
        Op.STOREA: lambda: t["post_idle"],
    }.get(op, lambda: True)()


def engine_ready(name, f, s):
    """The engine's ``ready`` for the instruction with fields ``f``: the DMA engine's is its
    slot's for a LOADA or STOREA without ``fence``, its idle otherwise (``hdl/dma.py``); none
    while its hand-off register holds an instruction."""
    if name in s["held"]:
        return False
    if name == "loadw" and s["handoff"]:    # with the hand-off: free in the next cycle
        return s["loadw_next"]
    if name == "dma":
        slotted = f["op"] in (Op.LOADA, Op.STOREA) and not f["fence"]
        return s["dma_slot_free"] if slotted else s["dma_idle"]
    return s[name]


def model(config, offer, s):
    """``(accept, {stream: go})`` for the offer ``(word, fields)`` or None."""
    go = {name: False for name in STREAMS}
    if offer is None:
        return False, go
    word, f = offer
    op, holds = f["op"], bool(rule(f["op"], f, s))
    engine = ENGINE.get(op)
    if engine == "dma" and not config.ext_memory:
        return False, go
    if engine is None:
        return holds, go
    go[engine] = holds and bool(engine_ready(engine, f, s))
    return go[engine], go


def random_instr(rng, op):
    fields = {g.name: int(rng.integers(g.min, g.max + 1)) for g in fields_of(op)}
    word = encode(**{**fields, "op": op})
    return word, decode(word)


def drive(ctx, dut, config, offer, s):
    ctx.set(dut.instr.valid, offer is not None)
    ctx.set(dut.instr.payload.as_value(), offer[0] if offer else 0)
    ctx.set(dut.decoded.as_value(), decoded_value(offer[0]) if offer else 0)
    for name in ("loadw", "matmul", "eltw", "post"):
        ctx.set(getattr(dut, name).ready, s[name])
    ctx.set(dut.loadw_free_next, s["loadw_next"])
    ctx.set(dut.bank_free, s["bank_free"])
    ctx.set(dut.drained, s["drained"])
    ctx.set(dut.mm_completed, s["completed"])
    if config.ext_memory:
        ctx.set(dut.dma_idle, s["dma_idle"])
        ctx.set(dut.dma_slot_free, s["dma_slot_free"])
        ctx.set(dut.boot, 0)


class Handoff:
    """What the engines' streams must show: what the model sent in a cycle, ``handoff_latency``
    cycles later (the POST's too)."""

    def __init__(self, config):
        self.latency = handoff_latency(config)
        self.sent = {}          # cycle -> {stream: payload}

    def send(self, cycle, name, word):
        self.sent.setdefault(cycle + self.latency, {})[name] = word

    def held(self, cycle) -> dict:
        """Engine -> fields of the instruction in its hand-off register in ``cycle``."""
        if not self.latency:
            return {}
        return {name: decode(word) for name, word in self.sent.get(cycle, {}).items()}

    def check(self, ctx, dut, config, cycle, where):
        expected = self.sent.pop(cycle, {})
        for name in STREAMS[:3] + (("dma",) if config.ext_memory else ()) + ("post",):
            stream = getattr(dut, name)
            assert ctx.get(stream.valid) == (name in expected), f"{name} valid, {where}"
            if name in expected:
                assert ctx.get(stream.payload.as_value()) == expected[name], \
                    f"{name} payload, {where}"


def check(ctx, dut, config, offer, s, cycle):
    """The DUT's decision in this cycle against the model's; returns what it sent."""
    accept, go = model(config, offer, s)
    where = f"cycle {cycle}: {offer and Op.NAMES[offer[1]['op']]} with {s}"
    assert ctx.get(dut.instr.ready) == accept, where
    assert ctx.get(dut.blocked) == (offer is not None and not accept), where
    assert ctx.get(dut.post_idle) == statuses(s)["post_idle"], where
    return accept, [name for name, sent in go.items() if sent]


def test_rules_cover_every_op():
    assert set(ACCEPT_RULES) == set(Op)
    assert {op: engine for op, (engine, _) in ACCEPT_RULES.items() if engine} == ENGINE


@pytest.mark.parametrize("config", [PLAIN, COMPACT, EXT], ids=["plain", "compact", "ext_memory"])
def test_each_op_under_every_status(config):
    """One cycle per (op, variant, status), then one with nothing on offer (the hand-off): the
    status bits in all combinations (``bank_free`` for LOADW, the one op that reads it), the
    POST slot empty (``mm_completed`` equal to the MATMULs taken, so a POST taken leaves at
    once)."""
    rng = np.random.default_rng(7)
    variants = {Op.LOADW: [dict(bank=0), dict(bank=1)], Op.ELTW: [dict(wait=0), dict(wait=1)],
                Op.LOADX: [dict(par_count=0), dict(par_count=3)],
                Op.LOADA: [dict(fence=0), dict(fence=1)],
                Op.STOREA: [dict(fence=0), dict(fence=1)]}
    cases = []
    for op in Op:
        for variant in variants.get(op, [{}]):
            word, _ = random_instr(rng, op)
            fields = {**decode(word), **variant}
            word = encode(**fields)
            banks = range(4) if op == Op.LOADW else [int(rng.integers(4))]
            for bits, bank_free in itertools.product(itertools.product((0, 1), repeat=7),
                                                     banks):
                s = dict(zip(("loadw", "matmul", "eltw", "post", "dma_slot_free", "drained",
                              "dma_idle"), bits), bank_free=bank_free, pending=0)
                if not config.ext_memory:
                    s.update(dma_slot_free=0, dma_idle=1)
                for soon in (0, 1) if op == Op.LOADW else [bits[0]]:
                    s = dict(s, loadw_next=bits[0] | soon, handoff=handoff_latency(config))
                    cases += [((word, decode(word)), s), (None, s)]
    dut = Dispatcher(config)
    handoff = Handoff(config)
    matmuls = [0]

    def step(ctx, cycle):
        offer, s = cases[cycle]
        s = dict(s, held=handoff.held(cycle), completed=matmuls[0] % 65536)
        drive(ctx, dut, config, offer, s)
        took, sent = check(ctx, dut, config, offer, s, cycle)
        for name in sent:
            handoff.send(cycle, name, offer[0])
        if took and offer[1]["op"] == Op.POST:
            handoff.send(cycle, "post", offer[0])
        matmuls[0] += took and offer[1]["op"] == Op.MATMUL
        handoff.check(ctx, dut, config, cycle, f"cycle {cycle}")

    run_cycles(dut, len(cases), step)


@pytest.mark.parametrize("config, seed", [(PLAIN, 1), (PLAIN, 2), (COMPACT, 5), (EXT, 6),
                                          (EXT, 4)],
                         ids=["plain-1", "plain-2", "compact-5", "ext_memory-6", "ext_memory-4"])
def test_random_program(config, seed):
    """A random program: ops weighted toward MATMUL and POST so that POSTs often wait; the
    feeder completes MATMULs a random while after taking them, the post-processor is busy a
    few cycles after each POST."""
    rng = np.random.default_rng(seed)
    ops = [Op.LOADW, Op.MATMUL, Op.MATMUL, Op.POST, Op.POST, Op.ELTW, Op.END, Op.SETMM,
           Op.LOOP] + ([Op.LOADX, Op.LOADP, Op.LOADA, Op.STOREA] if config.ext_memory else [])
    program = [random_instr(rng, int(rng.choice(ops))) for _ in range(200)]
    dut = Dispatcher(config)
    handoff = Handoff(config)
    state = dict(next=0, accepted=0, completed=0, post_busy=0, pending=None, waited=0,
                 matmuls=[], differ=0)     # matmuls: (index, cycle it counts for the feeder)
    delivered = []      # (index, where) in the order they reach an engine or are kept
    ext = bool(config.ext_memory)

    def step(ctx, cycle):
        i = state["next"]
        gap = rng.random() < 0.15
        offer = program[i] if i < len(program) and not gap else None
        if state["completed"] < state["accepted"] and rng.random() < 0.15:
            state["completed"] += 1
        s = dict(loadw=rng.random() < 0.7, matmul=rng.random() < 0.7,
                 eltw=rng.random() < 0.7, dma_slot_free=rng.random() < 0.7 and ext,
                 post=state["post_busy"] == 0, bank_free=int(rng.integers(4)),
                 drained=rng.random() < 0.6, dma_idle=rng.random() < 0.7 or not ext,
                 pending=state["pending"] is not None, held=handoff.held(cycle),
                 handoff=handoff.latency,
                 completed=state["completed"] % 65536)
        s["loadw_next"] = s["loadw"] or rng.random() < 0.3
        drive(ctx, dut, config, offer, s)
        took, sent = check(ctx, dut, config, offer, s, cycle)
        # posts_done: the post-processor idle, no POST handed over, and no POST in the slot
        # that came before the feeder's MATMUL (the last one to reach it, from the cycle
        # after it is handed over)
        arrived = [i for i, at in state["matmuls"] if at <= cycle]
        older = (state["pending"] is not None and bool(arrived)
                 and state["pending"][0] < arrived[-1])
        posts_done = s["post"] and "post" not in s["held"] and not older
        assert ctx.get(dut.posts_done) == posts_done, f"posts_done, cycle {cycle}"
        state["differ"] += posts_done != statuses(s)["post_idle"]
        for name in sent:
            handoff.send(cycle, name, offer[0])
        post = None
        if state["pending"] is not None and state["completed"] == state["pending"][1]:
            post, state["pending"] = state["pending"][0], None
        if took:
            op = offer[1]["op"]
            delivered.append((i, ENGINE.get(op, "kept")))     # a POST: into its slot
            state["next"] += 1
            if op == Op.MATMUL:
                state["accepted"] += 1
                state["matmuls"].append((i, cycle + handoff.latency + 1))
            if op == Op.POST:
                assert post is None
                if state["completed"] == state["accepted"]:
                    post = i
                else:
                    state["pending"] = (i, state["accepted"])
                    state["waited"] += 1
        if post is not None:
            assert s["post"], f"a POST given to a busy post-processor, cycle {cycle}"
            handoff.send(cycle, "post", program[post][0])
            delivered.append((post, "post"))
            state["post_busy"] = int(rng.integers(1, 5))
        elif state["post_busy"]:
            state["post_busy"] -= 1
        handoff.check(ctx, dut, config, cycle, f"cycle {cycle}")

    run_cycles(dut, 2500, step)
    assert state["next"] == len(program), "the program did not run to its end"
    taken = [(i, where) for i, where in delivered if where != "post"]
    assert taken == [(i, ENGINE.get(instr[1]["op"], "kept")) for i, instr in enumerate(program)]
    posts = [i for i, where in delivered if where == "post"]    # each POST once, in order
    assert 5 <= state["waited"] <= len(posts) - 5       # some waited in the slot, some not
    assert state["differ"] >= 5         # posts_done is not post_idle (a later POST waiting)
    assert posts == [i for i, instr in enumerate(program) if instr[1]["op"] == Op.POST]


def test_boot_gives_the_dma_engine_the_first_two_pages():
    """``boot`` in cycle 1: the DMA engine's stream has the LOADP of the first two pages
    ``handoff_latency`` cycles later, and nothing else."""
    dut = Dispatcher(EXT)
    want = encode(op=Op.LOADP, count=16 * ext_words_per_instruction(EXT.cols), prog_addr=0,
                  ext_addr=0)
    at = 1 + handoff_latency(EXT)

    def step(ctx, cycle):
        ctx.set(dut.boot, cycle == 1)
        assert ctx.get(dut.dma.valid) == (cycle == at)
        if cycle == at:
            assert ctx.get(dut.dma.payload.as_value()) == want
            assert not any(ctx.get(getattr(dut, name).valid)
                           for name in ("loadw", "matmul", "eltw", "post"))

    run_cycles(dut, 4, step)
