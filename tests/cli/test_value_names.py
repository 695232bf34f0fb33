"""Names the ONNX IR allows but a file format does not (issue 35): node names holding a newline
and a NUL built, but ``sim --golden`` and ``--compare`` raised a KeyError: the build folder's
``graph.npz`` keyed the constants by name, and a zip member's name ends at a NUL, so the
constants of two nodes whose names agree up to it were written under one name."""

import numpy as np
from onnx import helper

from hwonnx import api
from hwonnx.cli import main
from hwonnx.ir import Graph, Node, TensorType, load_graph, save_graph
from spec_helpers import make_model, rand

NAMES = ("dense\n\x00first", "relu\n\x00", "dense\n\x00second")


def named_mlp():
    """Gemm 16 -> 8, Relu, Gemm 8 -> 3, the nodes named ``NAMES``."""
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name=NAMES[0]),
             helper.make_node("Relu", ["h"], ["r"], name=NAMES[1]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name=NAMES[2])]
    inits = {"w1": rand(16, 8) * 0.3, "b1": rand(8, seed=1) * 0.1,
             "w2": rand(8, 3, seed=2) * 0.3, "b2": rand(3, seed=3) * 0.1}
    return make_model(nodes, {"x": [1, 16]}, {"y": [1, 3]}, inits)


def test_build_with_newline_and_nul_in_node_names_runs_on_the_golden_model(tmp_path, capsys):
    model = named_mlp()
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    calib, xs = rand(32, 16, seed=4), rand(6, 16, seed=5)
    np.save(tmp_path / "calib.npy", calib)
    np.save(tmp_path / "x.npy", xs)
    out = tmp_path / "out"
    assert main(["build", str(path), "-o", str(out), "--calib", str(tmp_path / "calib.npy")]) == 0
    code = main(["sim", str(out), "--input", str(tmp_path / "x.npy"), "--golden", "--output",
                 str(tmp_path / "y.npz")])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err, err

    # the reference: the same build's graph as compiled, never written to a folder
    compiled = api.build(model, None, calib={"x": calib}, verilog=False, log=lambda *_: None)
    want = api.run_golden(compiled, {"x": xs})
    with np.load(tmp_path / "y.npz") as saved:
        np.testing.assert_array_equal(saved["y"].reshape(6, 3), want.outputs["y"])
    # what --compare checks the RTL against: the golden model of the loaded folder
    loaded = api.load_build(out)
    got = api.run_golden(loaded, {"x": xs})
    for value, q in want.int_values.items():
        np.testing.assert_array_equal(got.int_values[value], q)
    assert {n.name for n in loaded.graph.nodes} >= {NAMES[0], NAMES[2]}


def test_graph_constants_keep_names_a_zip_member_cannot_hold(tmp_path):
    names = ("w\x00a", "w\x00b", "line\nbreak", "w")
    constants = {name: np.full(2, i, np.int8) for i, name in enumerate(names)}
    types = {"x": TensorType("int8", (1, 2)), "y": TensorType("int8", (1, 2))}
    graph = Graph((Node("n\x00\n", "Identity", ("x",), ("y",)),), ("x",), ("y",), types,
                  constants, {})
    save_graph(graph, tmp_path)
    loaded = load_graph(tmp_path)
    assert list(loaded.constants) == list(names)
    for name, value in constants.items():
        np.testing.assert_array_equal(loaded.constants[name], value)
    assert loaded.nodes[0].name == "n\x00\n"
