"""What the model-level RTL tests share: the array configurations of
tests/end_to_end/test_rtl.py (whose Verilator builds are cached) and He-normal test weights."""

import numpy as np

from hwonnx.config import ArchConfig

#: The 8x8 default and the 3x5 configuration of tests/end_to_end/test_rtl.py (cached Verilator
#: builds).
CONFIGS = {
    "8x8": ArchConfig(),
    "3x5": ArchConfig(rows=3, cols=5, act_depth=2048, wgt_depth=1024, acc_depth=64,
                      par_depth=64, prog_depth=2048),
}


def he_weight(rng, *shape, gain=1.0) -> np.ndarray:
    """float32 weights of ``shape`` (output first), He-normal scaled by ``gain``."""
    fan_in = int(np.prod(shape[1:]))
    return (rng.normal(0, gain * (2 / fan_in) ** 0.5, shape)).astype(np.float32)


def rtl_matches_golden(result, inputs: dict, samples: int):
    """Run ``inputs`` on the RTL in compare mode: every output equal to golden, every sample in
    the predicted cycles, every layer's output equal to golden (truncated programs). Returns
    the RTL's result."""
    from hwonnx.api import first_difference, simulate

    quiet = lambda message: None                                      # noqa: E731
    rtl = simulate(result, inputs, mode="compare", log=quiet)
    golden = simulate(result, inputs, mode="golden")
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [rtl.predicted_cycles] * samples
    assert first_difference(result, inputs, 0, log=quiet) == (
        "sample 0: every layer output matches; the difference is in the host I/O")
    return rtl


def float_reference(model, xs: np.ndarray) -> np.ndarray:
    """onnxruntime on the float model, one sample of ``xs`` at a time (input ``x``)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"x": x})[0] for x in xs])


def looped_ops(program) -> list:
    """The stored instructions' ops of ``program`` when every array layer is one looped nest
    (SETMM, SETPOST, LOOP) and every element-wise engine layer one ELTW and one POST per tile
    (the engine has no looped form), then END."""
    from hwonnx.compiler import Op

    return [op for layer in program.layers for op in (
        [Op.ELTW, Op.POST] * layer.tiles if layer.op == "QEltwise"
        else [Op.SETMM, Op.SETPOST, Op.LOOP])] + [Op.END]


def cli_build_and_compare(tmp_path, capsys, model, x: np.ndarray, calib: int = 8) -> np.ndarray:
    """What a user runs on ``model`` (one input ``x``): ``hwonnx build model.onnx --board sim
    --calib`` (the first ``calib`` samples of ``x``), then ``hwonnx sim --compare`` on the
    rest: both exit 0, the RTL equals golden bit for bit, every sample takes the predicted
    cycles (``report.json``). Returns the outputs ``sim`` wrote for output ``y``."""
    import json

    import onnx

    from hwonnx.cli import main

    onnx.save(model, tmp_path / "model.onnx")
    np.savez(tmp_path / "calib.npz", x=x[:calib])
    np.savez(tmp_path / "x.npz", x=x[calib:])
    out = tmp_path / "out"
    code = main(["build", str(tmp_path / "model.onnx"), "-o", str(out), "--board", "sim",
                 "--calib", str(tmp_path / "calib.npz")])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    code = main(["sim", str(out), "--input", str(tmp_path / "x.npz"), "--compare",
                 "--output", str(tmp_path / "y.npz")])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    predicted = json.loads((out / "report.json").read_text())["total"]["predicted_cycles"]
    assert f"{len(x) - calib} sample(s) on RTL: {predicted:,} cycles per sample (predicted " \
           f"{predicted:,})" in printed.out
    assert "RTL equals the golden model bit for bit" in printed.out.splitlines()
    with np.load(tmp_path / "y.npz") as npz:
        return npz["y"]
