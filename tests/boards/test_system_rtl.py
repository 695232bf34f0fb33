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


def test_two_inputs_and_two_outputs_over_uart():
    """A model of two inputs and two outputs (the residual sum, which the last layer also
    reads, and the result) on the ULX3S design: the host writes each input at its placement
    and reads each output at its own, over the UART."""
    from multi_io_models import samples, two_vectors_residual

    rng = np.random.default_rng(3)
    model, shapes = two_vectors_residual(rng, sum_out=True)
    board = get_board("ulx3s-85f")
    result = build(model, None, calib=samples(rng, shapes, 64), config=board.default_config,
                   log=lambda message: None)
    program = result.program
    assert (len(program.inputs), len(program.outputs)) == (2, 2)
    x = samples(rng, shapes, 3)
    q_in = {port.value: quantize(x[port.name], **dict(result.graph.producer(port.value).attrs))
            for port in program.inputs}
    outputs, cycles = run_system(program, q_in, build_id=build_id(program),
                                 log=lambda message: None)
    golden = simulate(result, x, mode="golden")
    for port in program.outputs:
        want = golden.int_values[port.value]
        np.testing.assert_array_equal(outputs[port.value].reshape(want.shape), want)
    assert cycles == [golden.predicted_cycles] * 3
