"""Saving and loading a program, and the tables written beside it (placements, last
writes, parameter words)."""

import re

import numpy as np
import pytest

from hwonnx.compiler import Op, encode_program, lower, predict
from hwonnx.compiler.timing import last_write
from hwonnx.compiler.artifact import load_program, save_program
from hwonnx.config import ArchConfig
from hwonnx.errors import ModelError

from compiler_helpers import chain


# saving ----------------------------------------------------------------------------------------

def test_save_load_program_round_trip(tmp_path):
    config = ArchConfig(rows=4, cols=4, acc_depth=16)
    program = lower(chain(), config)
    save_program(program, tmp_path)
    loaded = load_program(tmp_path)
    assert loaded.config == config
    assert loaded.instructions == program.instructions
    assert loaded.images == program.images
    assert loaded.layers == program.layers
    assert loaded.words == program.words
    assert (loaded.inputs, loaded.outputs) == (program.inputs, program.outputs)
    assert list(loaded.placements) == list(program.placements)
    for name, p in program.placements.items():
        q = loaded.placements[name]
        assert (q.base, q.height, q.width, q.cb, q.shape) == (p.base, p.height, p.width, p.cb,
                                                              p.shape)
        np.testing.assert_array_equal(q.logical, p.logical)
    hex_lines = (tmp_path / "prog.hex").read_text().splitlines()
    assert [int(line, 16) for line in hex_lines] == encode_program(program)
    assert predict(loaded.expanded(), config) == predict(program.expanded(), config)


def test_load_program_from_an_incomplete_folder(tmp_path):
    save_program(lower(chain(), ArchConfig(rows=4, cols=4)), tmp_path)
    (tmp_path / "placements.npz").unlink()
    with pytest.raises(ModelError,
                       match="^" + re.escape(f"'{tmp_path}' is not a complete hwonnx build "
                                             f"folder (") + r".+"
                       + re.escape("); run 'hwonnx build' first") + "$"):
        load_program(tmp_path)


def test_placement_table_names_streamed_depthwise_layers():
    """A depthwise 3x3 layer streams on the default 8x8 array and the placement table says
    so; a 1x1 depthwise layer with a stride along the rows does not (it would be slower)."""
    from onnx import TensorProto, helper, numpy_helper

    from hwonnx.api import build
    from hwonnx.report import placement_table

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (8, 1, 3, 3)).astype(np.float32), "a"),
             numpy_helper.from_array(rng.normal(0, 0.3, (8, 1, 1, 1)).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "a"], ["h"], name="dw3", group=8, pads=[1] * 4),
             helper.make_node("Conv", ["h", "b"], ["y"], name="dw1", group=8, strides=[1, 2])]
    graph = helper.make_graph(nodes, "dw", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 8, 6, 10])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 8, 6, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    result = build(model, None, calib={"x": rng.normal(0, 1, (4, 1, 8, 6, 10))},
                   verilog=False, log=lambda message: None)
    rows = {line.split(" | ")[0].strip("| "): line
            for line in placement_table(result.graph, result.program).splitlines()}
    assert "depthwise streaming" in rows["dw3"]
    assert "depthwise streaming" not in rows["dw1"]


def test_last_write_follows_the_feeders_walk_of_depthwise_rows():
    """``timing.last_write`` against the feeder's walk stated word by word
    (``hdl/feeder.py``): ``ox`` runs over rows of ``ow`` from 0, ``phase`` counts words mod
    ``vstride`` from each row's start, and a word is kept (writes ``acc_addr``, which then
    advances) when ``phase`` is 0 and ``ox <= vlast``."""
    config = ArchConfig(rows=2, cols=2, acc_depth=64)
    rng = np.random.default_rng(7)
    for _ in range(300):
        ow, vstride = int(rng.integers(1, 9)), int(rng.integers(1, 4))
        vlast, count = int(rng.integers(0, ow)), int(rng.integers(1, 4 * ow))
        acc_addr = int(rng.integers(0, config.acc_depth))
        addr, ox, phase, written = acc_addr, 0, 0, None
        for _word in range(count):
            written = addr % config.acc_depth if phase == 0 and ox <= vlast else None
            addr += written is not None
            ox, phase = (0, 0) if ox == ow - 1 else (ox + 1, (phase + 1) % vstride)
        instr = dict(op=Op.MATMUL, count=count, acc_addr=acc_addr, dw=1, ow=ow,
                     vstride=vstride, vlast=vlast)
        assert last_write(instr, config) == written, (ow, vstride, vlast, count)
    assert last_write(dict(op=Op.MATMUL, count=5, acc_addr=62), config) == 66 % 64


def test_parameter_words_are_kept_per_layout():
    """The emitter's parameter words are packed once per layout and channels' values, for
    every lowering after (param_words._WORDS): the same word as packed anew, and another
    for another array's columns."""
    import importlib
    from dataclasses import replace as changed

    from hwonnx.hdl.layouts import ParamLayout
    words = importlib.import_module("hwonnx.compiler.param_words")

    values = ((5, -7), (1 << 20, 3), (9, 12))
    for cols in (8, 4):
        layout = ParamLayout(changed(ArchConfig(), cols=cols))
        word = words.param_word(*values, layout)
        assert word == words.param_word(*values, layout)
        assert word == words.packed_param_word(*values, layout)
        assert (ParamLayout, cols, *values) in words._WORDS   # (a layout is its columns)
    assert len({k[1] for k in words._WORDS if k[2:] == values}) == 2
