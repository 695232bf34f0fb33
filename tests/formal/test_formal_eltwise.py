"""Formal proof of the element-wise engine's per-lane arithmetic (``hdl/eltwise.py``) for every
input (SymbiYosys + Yices, :mod:`formal_helpers`): one ELTW of one word dispatched in cycle 0
to a 1x1 engine, operand A's word on the read port in cycle 3 and B's from cycle 4 (the
activation buffer's read latency, 2, after the reads in cycles 1 and 2), and every operand a
free constant of the run (``a``, ``b``, the zero points ``za``, ``zb``, the 18-bit weights
``ka``, ``kb``). By a bounded model check of depth 13 the accumulator word is written exactly
once, in cycle 10 (``2 + eltw_latency``, the cycle model's), with the golden ``eltwise_acc``
(docs/arithmetic.md, "Element-wise operators"): ``A = a - za``, ``B = b - zb``,
``p = A * (B if mul else ka)``, ``q = B * kb``, then ``p + q``, ``max(p, q)`` or
``min(p, q)``, one proof per ``mode``, with ``mul`` 0 (Add, Sub, Mean, Max, Min). Not proved:
``mul`` 1 (Mul, ``p = A * B``): the solver did not finish in two minutes.
"""

import pytest
from amaranth.hdl import Assert, Assume, Module, Mux, Signal, signed

from hwonnx.config import ArchConfig
from hwonnx.hdl.bram import buffer_read_latency
from hwonnx.hdl.eltwise import EltwiseEngine, eltw_latency
from hwonnx.hdl.layouts import EltwLayout
from hwonnx.isa import ELTW_MODES, Op

from formal_helpers import bmc, cycle_counter, held, tools_missing

@pytest.fixture(autouse=True)
def _formal_tools():
    """The tools come with the test extra: missing, the proofs fail (never skip)."""
    if tools_missing():
        pytest.fail(f"the proofs need {', '.join(tools_missing())}: pip install -e '.[test]'")

CONFIG = ArchConfig(rows=1, cols=1, act_depth=64, wgt_depth=32, acc_depth=16, par_depth=4,
                    prog_depth=16, lut_tables=0)
WRITE = 2 + eltw_latency(CONFIG)
DEPTH = WRITE + 3


def eltwise_harness(mode: str, mul: int, wrong: bool = False):
    config = CONFIG
    m = Module()
    m.submodules.dut = dut = EltwiseEngine(config)
    cycle = cycle_counter(m, DEPTH)
    ports = [Signal(signed(8), name=n) for n in ("a", "b", "za", "zb")] + \
        [Signal(signed(18), name=n) for n in ("ka", "kb")]
    a, b, za, zb, ka, kb = (held(m, port, cycle) for port in ports)
    instr = Signal(EltwLayout())
    m.d.comb += [instr.op.eq(Op.ELTW), instr.mode.eq(ELTW_MODES[mode]), instr.mul.eq(mul),
                 instr.count.eq(1), instr.za.eq(za), instr.zb.eq(zb), instr.ka.eq(ka),
                 instr.kb.eq(kb),
                 dut.instr.payload.as_value()[:len(instr.as_value())].eq(instr),
                 dut.instr.valid.eq(cycle == 0),
                 dut.act_data[0].eq(Mux(cycle == 1 + buffer_read_latency(config), a, b))]
    if wrong:            # a reference that forgets B's zero point where A's is zero
        m.d.comb += Assume(za == 0)
    # (a - za, b - zb in [-255, 255]: 9 bits; the products 27 bits, as the multipliers')
    da, db, db_wide = Signal(signed(9)), Signal(signed(9)), Signal(signed(18))
    m.d.comb += [da.eq(a - za), db.eq(b - (0 if wrong else zb)), db_wide.eq(db)]
    p, q, expected = Signal(signed(27)), Signal(signed(27)), Signal(signed(32))
    m.d.comb += [p.eq(da * (db_wide if mul else ka)), q.eq(db * kb),
                 expected.eq({"sum": p + q, "max": Mux(p > q, p, q),
                              "min": Mux(p < q, p, q)}[mode])]
    m.d.comb += Assert(dut.acc_we[0] == (cycle == WRITE))
    with m.If(dut.acc_we[0]):
        m.d.comb += Assert(dut.acc_data[0] == expected)
    return m, ports


@pytest.mark.parametrize("mode", sorted(ELTW_MODES))
def test_eltwise_lane_proved(tmp_path, mode):
    m, ports = eltwise_harness(mode, 0)
    proof = bmc(m, ports, DEPTH, tmp_path)
    assert proof.passed, proof.log


def test_eltwise_lane_wrong_reference_fails(tmp_path):
    m, ports = eltwise_harness("sum", 0, wrong=True)
    proof = bmc(m, ports, DEPTH, tmp_path)
    assert proof.status == "FAIL", proof.log
