"""Formal proof of the array's multiply-accumulate for every int8 operand (SymbiYosys + Yices,
:mod:`formal_helpers`): a column of two PEs (``hdl/array.py``, a 2x1 array), PE (1, 0) adding
its product to the partial sum of PE (0, 0). The harness loads weight ``w0`` into row 0 in
cycle 0 and ``w1`` into row 1 in cycle 1 (in bank ``bank``), then feeds the activation word
``(a0, a1)`` in that bank in every cycle; every value is a free constant of the run, the bank
one proof each (with a free bank the solver had to see through the bank's multiplexer in front
of the multiplier: not done in minutes). From
cycle :data:`SETTLED` to the end of the bounded model check (depth :data:`DEPTH`) the column's
sum is ``a0 w0 + a1 w1``, exactly, with each PE's product from a ``$mul`` (a DSP block). Not
proved here: the PEs whose products come from logic (``hdl/dsp.py``'s ``logic_product``):
that a tree of partial products equals a ``$mul`` did not finish in four minutes in the
array; the product alone is proved in ``tests/hdl/test_hdl_dsp_split.py``.
"""

import pytest
from amaranth.hdl import Assert, Module, Mux, Signal, signed

from hwonnx.config import ArchConfig
from hwonnx.hdl.array import SystolicArray

from formal_helpers import bmc, cycle_counter, held, tools_missing

@pytest.fixture(autouse=True)
def _formal_tools():
    """The tools come with the test extra: missing, the proofs fail (never skip)."""
    if tools_missing():
        pytest.fail(f"the proofs need {', '.join(tools_missing())}: pip install -e '.[test]'")

#: The cycle from which the sum of the held word is on ``sums`` (weights written in cycles 0
#: and 1; the second row's skew, the operand and product registers, the two partial sums).
SETTLED = 6
DEPTH = 9


def mac_harness(logic_products: int, bank: int, wrong: bool = False):
    config = ArchConfig(rows=2, cols=1, act_depth=64, wgt_depth=32, acc_depth=16,
                        par_depth=4, prog_depth=16, lut_tables=0)
    m = Module()
    m.submodules.array = array = SystolicArray(config, logic_products=logic_products)
    cycle = cycle_counter(m, DEPTH)
    ports = [Signal(signed(8), name=n) for n in ("a0", "a1", "w0", "w1")]
    a0, a1, w0, w1 = (held(m, port, cycle) for port in ports)
    m.d.comb += [array.wload_en.eq(cycle < 2), array.wload_row.eq(cycle == 1),
                 array.wload_bank.eq(bank), array.wload_data[0].eq(Mux(cycle == 0, w0, w1)),
                 array.feed[0].eq(a0), array.feed[1].eq(a1), array.feed_bank.eq(bank),
                 array.feed_dw.eq(0)]
    expected = Signal(signed(32))
    m.d.comb += expected.eq(a0 * w0 + a1 * w1 + (1 if wrong else 0) * (a0 == w1))
    with m.If(cycle >= SETTLED):
        m.d.comb += Assert(array.sums[0] == expected)
    return m, ports


@pytest.mark.parametrize("bank", [0, 1])
def test_column_mac_proved(tmp_path, bank):
    m, ports = mac_harness(0, bank)
    proof = bmc(m, ports, DEPTH, tmp_path)
    assert proof.passed, proof.log


def test_column_mac_wrong_reference_fails(tmp_path):
    """The same check against a reference off by one where ``a0 == w1`` fails."""
    m, ports = mac_harness(0, 1, wrong=True)
    proof = bmc(m, ports, DEPTH, tmp_path)
    assert proof.status == "FAIL", proof.log
