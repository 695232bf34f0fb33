"""Formal proof of the stream handshakes between the dispatcher (``hdl/dispatch.py``) and the
engines, for every input (SymbiYosys + Yices, :mod:`formal_helpers`): no instruction is lost
or duplicated on its way from the offer (``instr``) to its engine's stream.

Every input of the :class:`~hwonnx.hdl.dispatch.Dispatcher` is free in every cycle: the offer
(``instr.valid`` and the whole 421-bit ``instr.payload``, neither held while not taken: the
dispatcher assumes nothing of its producer), the engines' ``ready``, the feeder's status
(``bank_free``, ``drained``, a free 16-bit ``mm_completed``), ``loadw_free_next``, and with an
external memory ``dma_idle``, ``dma_slot_free`` and ``boot``. Assumed, the environment's
documented contract only:

- ``decoded`` is the offer decoded (:func:`~hwonnx.hdl.layouts.decoded`, wired here; the fetch
  unit and the tile walker keep it in registers beside the instruction);
- an engine's ``ready`` does not fall without a transfer (an idle engine stays idle until it
  takes an instruction); the loader's ``free_next`` is high when it is ready, and with it high
  and no LOADW taken the loader is ready in the next cycle (``hdl/loader.py``); the DMA
  engine's ``ready`` is ``slot_free`` for a LOADA or STOREA without ``fence``, else ``idle``
  (``hdl/dma.py``), each not falling without a transfer, ``idle`` implying ``slot_free``;
- ``boot`` only with nothing on offer, the DMA engine idle and nothing on its stream (the cycle
  after ``start``, ``hdl/top.py``).

Proved, in every cycle of a bounded model check (depth :data:`DEPTH`), with ``h`` =
:func:`~hwonnx.hdl.dispatch.handoff_latency` (1; 0 in the compact datapath) and the op-to-engine
map written here (:data:`ENGINE`), not read from ``ACCEPT_RULES``:

1. the offer is taken (``instr.ready``) only while ``valid``, and only an instruction of a
   known op;
2. each of the streams ``loadw``, ``matmul``, ``eltw``, ``dma``: ``valid`` is high exactly in
   the cycles ``h`` after the dispatcher took an instruction of that engine's ops (for ``dma``
   also ``boot``), with that instruction (the boot LOADP) as ``payload``: every taken
   instruction reaches its engine once, none is invented or repeated;
3. the ``post`` stream: a POST taken waits in the one-entry slot and goes out exactly ``h``
   cycles after the first cycle, from the one it is taken in, in which ``mm_completed`` equals
   the count of MATMULs taken before it, with its own payload; no POST is taken while one
   waits (it would overwrite the slot);
4. on every stream, ``valid`` implies ``ready``: the engine takes the instruction in the one
   cycle it is offered (``valid`` is a pulse, never held: the engines take the payload in every
   cycle they are ready, ``hdl/layouts.py``'s ``instr_stream``), so ``valid`` is never dropped
   unanswered and a transfer is exactly a ``valid`` cycle. This is the rule
   ``hwonnx/compiler/timing.py`` relies on: every engine starts ``h`` cycles after the dispatch.

One proof per datapath: plain, compact (``h`` 0) and external memory (the DMA stream, ``boot``).
The mutations fail the proof: ELTW kept by the dispatcher instead of sent (lost), the MATMUL
stream's ``valid`` held a second cycle as in an AXI-style hand-off (duplicated), and an engine
whose ``ready`` may fall with nothing taken (an environment outside the contract: the pulse
goes unanswered).
"""

import dataclasses
from pathlib import Path

import pytest
from amaranth.hdl import Assert, Assume, Cat, Module, Mux, Signal, Value

from hwonnx.hdl import dispatch
from hwonnx.hdl.dispatch import Dispatcher, handoff_latency
from hwonnx.hdl.layouts import DecodedLayout, InstrLayout, decoded
from hwonnx.isa import Op

from formal_helpers import bmc, cycle_counter, tools_missing
from hdl_helpers import small_config


@pytest.fixture(autouse=True)
def _formal_tools():
    """The tools come with the test extra: missing, the proofs fail (never skip)."""
    if tools_missing():
        pytest.fail(f"the proofs need {', '.join(tools_missing())}: pip install -e '.[test]'")


#: Which engine's stream each op goes out on (written from ``hwonnx/isa.py``'s op
#: descriptions); POST goes through the slot onto ``post``; END and the walker's are kept.
ENGINE = {Op.LOADW: "loadw", Op.MATMUL: "matmul", Op.ELTW: "eltw", Op.LOADX: "dma",
          Op.LOADP: "dma", Op.LOADA: "dma", Op.STOREA: "dma"}
PLAIN = small_config(2, 2)
CONFIGS = {"plain": PLAIN, "compact": dataclasses.replace(PLAIN, mul_stages=1),
           "ext_memory": dataclasses.replace(PLAIN, ext_memory="ulx3s-sdram", ext_depth=1024,
                                             prog_depth=16, prog_page=8)}
DEPTH = 8


def _delayed(m, value, h: int, name: str):
    """``value`` ``h`` cycles later (0 before), ``h`` 0 or 1."""
    value = Value.cast(value)
    if not h:
        return value
    d = Signal(len(value), name=name)
    m.d.sync += d.eq(value)
    return d


def dispatch_harness(config, mutation: str = "", reach: bool = False):
    """The dispatcher with free inputs, the contract assumed and the properties asserted.
    ``mutation``: ``lost_eltw`` (ELTW's rule keeps it), ``held_valid`` (the MATMUL stream's
    ``valid`` seen for two cycles), ``ready_drops`` (no assumption on the engines' ``ready``).
    ``reach``: also assert that the last cycle of the run does not hand over, at once, a POST
    that waited in the slot and a MATMUL: a check that fails unless the assumptions leave runs
    of the whole depth that exercise the slot (the proof is not vacuous)."""
    m = Module()
    m.submodules.dut = dut = Dispatcher(config)
    h = handoff_latency(config)
    ext = bool(config.ext_memory)
    names = ("loadw", "matmul", "eltw") + (("dma",) if ext else ())

    offer_valid, payload = Signal(name="offer_valid"), Signal(InstrLayout(), name="offer")
    ports = [offer_valid, payload.as_value()]
    status = {"bank_free": Signal(2, name="f_bank_free"), "drained": Signal(name="f_drained"),
              "loadw_free_next": Signal(name="f_loadw_free_next"),
              "mm_completed": Signal(16, name="f_mm_completed")}
    if ext:
        status.update(dma_idle=Signal(name="f_dma_idle"),
                      dma_slot_free=Signal(name="f_dma_slot_free"), boot=Signal(name="f_boot"))
    ready = {name: Signal(name=f"f_{name}_ready") for name in ("loadw", "matmul", "eltw",
                                                               "post")}
    ports += list(status.values()) + list(ready.values())
    dec = Signal(DecodedLayout(), name="offer_decoded")
    m.d.comb += [dut.instr.valid.eq(offer_valid), dut.instr.payload.eq(payload),
                 dec.eq(decoded(payload)), dut.decoded.eq(dec)]
    m.d.comb += [getattr(dut, k).eq(v) for k, v in status.items()]

    # What the engines see: the streams as they leave the dispatcher (with ``held_valid``, the
    # MATMUL stream's valid stretched over a second cycle).
    valid = {name: getattr(dut, name).valid for name in names + ("post",)}
    if mutation == "held_valid":
        before = Signal(name="matmul_valid_before")
        m.d.sync += before.eq(dut.matmul.valid)
        valid["matmul"] = Signal(name="matmul_valid_seen")
        m.d.comb += valid["matmul"].eq(dut.matmul.valid | before)
    if ext:            # the DMA engine's ready for the instruction on its stream (hdl/dma.py)
        on_stream = decoded(dut.dma.payload)
        ready["dma"] = Signal(name="dma_ready")
        m.d.comb += ready["dma"].eq(Mux(on_stream[-1], status["dma_slot_free"],
                                        status["dma_idle"]))
    for name in ("loadw", "matmul", "eltw", "post"):
        m.d.comb += getattr(dut, name).ready.eq(ready[name])
    if ext:
        m.d.comb += dut.dma.ready.eq(ready["dma"])
    take = {name: Signal(name=f"{name}_take") for name in valid}
    m.d.comb += [take[name].eq(valid[name] & ready[name]) for name in valid]

    # The environment's contract (``decoded`` is the offer's, by the wiring above); the
    # registers of the cycle before are 0 in cycle 0.
    if mutation != "ready_drops":
        watched = {name: ready[name] for name in ("loadw", "matmul", "eltw", "post")}
        if ext:
            watched.update(idle=status["dma_idle"], slot_free=status["dma_slot_free"])
            m.d.comb += Assume(~status["dma_idle"] | status["dma_slot_free"])
        for name, signal in watched.items():
            taken = take.get(name, take.get("dma"))
            was, was_taken = Signal(name=f"{name}_was"), Signal(name=f"{name}_was_taken")
            m.d.sync += [was.eq(signal), was_taken.eq(taken)]
            with m.If(was & ~was_taken):
                m.d.comb += Assume(signal)
        free_was = Signal(name="free_next_was")
        m.d.sync += free_was.eq(status["loadw_free_next"] & ~take["loadw"])
        m.d.comb += Assume(~ready["loadw"] | status["loadw_free_next"])
        with m.If(free_was):
            m.d.comb += Assume(ready["loadw"])
    if ext:
        with m.If(status["boot"]):
            m.d.comb += Assume(~offer_valid & status["dma_idle"] & ~dut.dma.valid)

    # 1. Taken only while on offer, only a known op.
    fire = Signal(name="offer_fire")
    m.d.comb += fire.eq(offer_valid & dut.instr.ready)
    m.d.comb += Assert(~dut.instr.ready | offer_valid)
    op = payload.op
    def one_of(codes):
        return Cat(*(op == code for code in codes)).any()

    with m.If(fire):
        m.d.comb += Assert(one_of(Op))
        if not ext:
            m.d.comb += Assert(~one_of(c for c, e in ENGINE.items() if e == "dma"))

    # 2. The engines' streams: valid exactly h cycles after a take of one of their ops.
    for name in names:
        accepted = Signal(name=f"{name}_accepted")
        taken_here = fire & one_of(c for c, e in ENGINE.items() if e == name)
        word = payload.as_value()
        if name == "dma":
            taken_here, word = taken_here | status["boot"], Mux(status["boot"],
                                                                 dut.boot_word(), word)
        m.d.comb += accepted.eq(taken_here)
        expected = Signal(InstrLayout(), name=f"{name}_expected")
        m.d.comb += expected.eq(word)
        due, due_word = _delayed(m, accepted, h, f"{name}_due"), \
            _delayed(m, expected, h, f"{name}_due_word")
        m.d.comb += Assert(valid[name] == due)
        with m.If(valid[name]):
            m.d.comb += Assert(getattr(dut, name).payload.as_value() == due_word)

    # 3. POST: through the slot, out h cycles after the first cycle the MATMULs before it are
    # done.
    taken_mm = Signal(16, name="spec_matmuls")      # MATMULs taken (modulo 2**16)
    with m.If(fire & (op == Op.MATMUL)):
        m.d.sync += taken_mm.eq(taken_mm + 1)
    waiting, target = Signal(name="spec_post_waiting"), Signal(16, name="spec_post_target")
    slot = Signal(InstrLayout(), name="spec_post_slot")
    post_taken, post_go = Signal(name="spec_post_taken"), Signal(name="spec_post_go")
    m.d.comb += [post_taken.eq(fire & (op == Op.POST)),
                 post_go.eq((waiting & (status["mm_completed"] == target))
                            | (post_taken & (status["mm_completed"] == taken_mm)))]
    with m.If(post_taken):
        m.d.comb += Assert(~waiting)
        m.d.sync += [target.eq(taken_mm), slot.eq(payload)]
    m.d.sync += waiting.eq((waiting | post_taken) & ~post_go)
    post_word = Signal(InstrLayout(), name="spec_post_word")
    m.d.comb += post_word.eq(Mux(waiting, slot.as_value(), payload.as_value()))
    due, due_word = _delayed(m, post_go, h, "post_due"), _delayed(m, post_word, h,
                                                                  "post_due_word")
    m.d.comb += Assert(valid["post"] == due)
    if reach:
        cycle = cycle_counter(m, DEPTH)
        from_slot = _delayed(m, waiting & post_go, h, "post_from_slot")
        m.d.comb += Assert(~((cycle == DEPTH - 1) & from_slot & valid["post"]
                             & valid["matmul"]))
    with m.If(valid["post"]):
        m.d.comb += Assert(dut.post.payload.as_value() == due_word)

    # 4. Taken in the cycle offered.
    for name in valid:
        m.d.comb += Assert(~valid[name] | ready[name])
    return m, ports


def _proof(tmp_path, config, mutation="", reach=False):
    m, ports = dispatch_harness(config, mutation, reach)
    return bmc(m, ports, DEPTH, tmp_path)


def _failed_lines(proof) -> "set[str]":
    """The source lines of the assertions that failed (from SymbiYosys's summary)."""
    lines = set()
    for where in (line for line in proof.log.splitlines() if "failed assertion" in line):
        path, line = where.split(" at ")[1].split(" step ")[0].rsplit(":", 1)
        lines.add(Path(path).read_text().splitlines()[int(line.split(".")[0]) - 1].strip())
    return lines


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_dispatch_handshakes_proved(tmp_path, name):
    proof = _proof(tmp_path, CONFIGS[name])
    assert proof.passed, proof.log


@pytest.mark.parametrize("mutation", ["lost_eltw", "held_valid", "ready_drops"])
def test_dispatch_handshake_mutation_fails(tmp_path, monkeypatch, mutation):
    if mutation == "lost_eltw":          # the dispatcher keeps ELTW: taken, never sent
        monkeypatch.setitem(dispatch.ACCEPT_RULES, Op.ELTW, (None, lambda s: s.drained))
    proof = _proof(tmp_path, PLAIN, mutation)
    assert proof.status == "FAIL", proof.log
    # lost and duplicated: a stream's valid against the takes; unanswered: valid without ready
    expected = {"ready_drops": "m.d.comb += Assert(~valid[name] | ready[name])"
                }.get(mutation, "m.d.comb += Assert(valid[name] == due)")
    assert expected in _failed_lines(proof), proof.log


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_dispatch_harness_not_vacuous(tmp_path, name):
    """Within the assumptions, the last cycle of the run can hand over a POST that waited in
    the slot together with a MATMUL."""
    proof = _proof(tmp_path, CONFIGS[name], reach=True)
    assert proof.status == "FAIL", proof.log
    assert any("from_slot" in line for line in _failed_lines(proof)), proof.log
