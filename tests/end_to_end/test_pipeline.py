"""The build as one list of named steps (``hwonnx/pipeline.py``): the steps in order, each a
function from one frozen state to a new one, and the steps run one by one give what
``api.build`` gives."""

import dataclasses

import pytest

from hwonnx import api
from hwonnx.compiler.program import encode_program
from hwonnx.examples import example_path
from hwonnx.pipeline import BUILD_STEPS, BuildState, build_request, run_steps
from helpers import quiet

MLP = str(example_path("digits_mlp"))


def test_the_build_is_one_list_of_named_steps():
    assert [name for name, _ in BUILD_STEPS] == [
        "read", "float-passes", "quantize", "fit-architecture", "lower-and-size", "fit-board",
        "report", "write"]


def test_the_steps_one_by_one_give_the_build(digits):
    calib = {"image": digits["calib"]}
    state = BuildState(build_request(MLP, None, calib=calib, verilog=False, log=quiet))
    for name, step in BUILD_STEPS[:-1]:
        new = step(state)
        assert new is not state or name == "fit-board"      # the simulation fits as it is
        state = new
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.programs = ()
    result = api.build(MLP, None, calib=calib, verilog=False, log=quiet)
    assert len(state.programs) == 1 and result.segments == ()
    assert encode_program(state.programs[0]) == encode_program(result.program)
    assert state.report == result.report
    again = run_steps(BuildState(state.request), tuple(name for name, _ in BUILD_STEPS[:-1]))
    assert encode_program(again.programs[0]) == encode_program(result.program)
