"""Tier 3: the board design (accelerator with its program in block-RAM initial contents, UART
host bridge) on Verilator, driven over its UART pins by the same protocol client that
``hwonnx run`` uses with a serial port; outputs equal the golden model."""

import numpy as np
import pytest

from hwonnx.api import build, simulate
from hwonnx.boards import get_board
from hwonnx.boards.build import build_id
from hwonnx.examples import example_path, load_digits_data
from hwonnx.golden import quantize
from hwonnx.sim.system import run_system

pytestmark = pytest.mark.rtl


@pytest.mark.parametrize("board_name", ["ulx3s-85f", "icebreaker"])
def test_bundled_example_over_uart(board_name):
    """ULX3S: the program is in the bitstream. iCEBreaker: the program memory is SPRAM, so the
    host loads the program over the UART first (LOAD), then runs the samples."""
    data = load_digits_data()
    board = get_board(board_name)
    result = build(example_path("digits_mlp"), None, calib={"image": data["calib"]},
                   config=board.default_config, log=lambda message: None)
    images = data["test_images"][:3]
    quantizer = next(n for n in result.graph.nodes if n.op == "Quantize")
    q_in = quantize(images, **dict(quantizer.attrs)).reshape((-1, 1, 64))
    program = result.program
    outputs, cycles = run_system(program, {program.input_value: q_in},
                                 divisor=4 if board.huge_rams else 8,
                                 build_id=build_id(program), log=lambda message: None)
    golden = simulate(result, {"image": images}, mode="golden")
    np.testing.assert_array_equal(outputs[program.output_value].reshape(
        golden.int_outputs.shape), golden.int_outputs)
    assert cycles == [golden.predicted_cycles] * 3
