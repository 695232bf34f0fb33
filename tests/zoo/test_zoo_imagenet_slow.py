"""The slow tier of the external memory (issue 16): ImageNet-class models of
:mod:`hwonnx.zoo.imagenet` compiled for the ULX3S-85F with its SDRAM and run on the RTL with
the SDRAM's memory model: every tensor that does not fit the activation buffer (the 224x224
or 256x256 input among them) lives in the SDRAM, every layer whose weights do not fit
streams them (in parts of output channels where a layer's are too many for a slot), and one
sample's outputs equal golden's bit for bit in exactly the predicted cycles. The board build
sizes the buffers (the weight buffer 4,096 words by default, grown to what two weight slots
need where they do not fit; the activation buffer to the tensors left on chip), pages the
program from the SDRAM (12 block RAMs: two pages of 256 instructions) and grows the staging
buffers through which the bands move while the design stays within 75% of the ECP5-85F's 208
block RAMs (a model whose smallest buffers take more keeps those).
``bench/bench_imagenet.py`` measures the same builds.

The default suite runs the same mechanisms on small models (test_spilled_activations.py,
test_external_weights.py). Each model here takes minutes to compile and to simulate."""

from dataclasses import replace

import numpy as np
import pytest

from hwonnx.api import build, compile_model, simulate
from hwonnx.boards import check_board_fit, get_board
from hwonnx.fitting import configure_arch
from hwonnx.isa import Op
from hwonnx.zoo import random_inputs
from hwonnx.zoo.imagenet import IMAGENET

pytestmark = pytest.mark.slow


def _quiet(message):
    pass


@pytest.mark.parametrize("name", list(IMAGENET))
def test_imagenet_class_model_runs_bit_exact_with_the_sdram_model(name):
    """The board build's sizing (``hwonnx build --board ulx3s-85f --ext-memory
    ulx3s-sdram``), its fit check, and the RTL with the SDRAM's memory model running the
    program so sized: bit-exact with golden in the predicted cycles."""
    model = IMAGENET[name](0)
    calib = random_inputs(model, 4, 0)
    board = get_board("ulx3s-85f")
    config = configure_arch(replace(board.default_config, clock_hz=board.clock_hz),
                            "ulx3s-sdram")
    _, program = compile_model(model, calib, config=config, size=board.name, log=_quiet)
    cfg = program.config
    assert cfg.wgt_depth >= 4096 and cfg.stage_in_depth and cfg.stage_out_depth
    assert {Op.LOADA, Op.STOREA} <= {instr.op for instr in program.instructions}
    assert program.placements["input:q"].memory == "ext"
    assert program.words["ext"] > cfg.act_depth + cfg.wgt_depth
    assert program.config.prog_page == 256 and program.config.prog_depth == 512
    check_board_fit(program, board)                     # raises ResourceError if not
    result = build(model, None, config=program.config, calib=calib, log=_quiet)
    assert len(result.program.instructions) == len(program.instructions)
    inputs = random_inputs(model, 1, 1)
    rtl = simulate(result, inputs, mode="compare", log=_quiet)
    golden = simulate(result, inputs, mode="golden")
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [rtl.predicted_cycles]
