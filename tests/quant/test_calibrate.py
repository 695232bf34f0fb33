"""Calibration methods (``--calibrate``): the ranges onnxruntime's calibrators give for
percentile and entropy, on the same model and samples and on the same arrays; ``mse`` against
a brute-force NumPy search; the methods refused by name."""

import contextlib
import io

import numpy as np
import pytest
from onnx import helper, numpy_helper, save
from onnxruntime.quantization.calibrate import (CalibrationDataReader, CalibrationMethod,
                                                HistogramCollector, create_calibrator)

from hwonnx import api
from hwonnx.cli import main
from hwonnx.errors import UsageError
from hwonnx.frontend import load_model
from hwonnx.ir.evaluate import evaluate_float
from hwonnx.quant import quantize_model
from hwonnx.quant.calibrate import METHODS, calibrated_range
from hwonnx.quant.data import calibration_feeds

from helpers import raises

#: onnxruntime's create_calibrator options hwonnx's methods match: its percentile defaults;
#: entropy with 2,048 histogram bins (its default, 128, leaves a single candidate window).
ORT = {"percentile": (CalibrationMethod.Percentile, {}),
       "entropy": (CalibrationMethod.Entropy, {"num_bins": 2048})}


def exporter_model():
    """A small CNN named as torch.onnx names a ``features``/``classifier`` module's nodes."""
    rng = np.random.default_rng(7)

    def init(name, shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32),
                                       name)

    inits = [init("features.0.weight", (8, 3, 3, 3)), init("features.0.bias", (8,), 0.1),
             init("features.3.weight", (8, 8, 3, 3), 0.2), init("features.3.bias", (8,), 0.1),
             init("classifier.weight", (10, 8)), init("classifier.bias", (10,), 0.1)]
    conv = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [1, 1]}
    nodes = [
        helper.make_node("Conv", ["input", "features.0.weight", "features.0.bias"],
                         ["/features/features.0/Conv_output_0"],
                         name="/features/features.0/Conv", **conv),
        helper.make_node("Relu", ["/features/features.0/Conv_output_0"],
                         ["/features/features.1/Relu_output_0"], name="/features/features.1/Relu"),
        helper.make_node("MaxPool", ["/features/features.1/Relu_output_0"],
                         ["/features/features.2/MaxPool_output_0"], kernel_shape=[2, 2],
                         strides=[2, 2], name="/features/features.2/MaxPool"),
        helper.make_node("Conv", ["/features/features.2/MaxPool_output_0", "features.3.weight",
                                  "features.3.bias"], ["/features/features.3/Conv_output_0"],
                         name="/features/features.3/Conv", **conv),
        helper.make_node("Relu", ["/features/features.3/Conv_output_0"],
                         ["/features/features.4/Relu_output_0"], name="/features/features.4/Relu"),
        helper.make_node("GlobalAveragePool", ["/features/features.4/Relu_output_0"],
                         ["/pool/GlobalAveragePool_output_0"], name="/pool/GlobalAveragePool"),
        helper.make_node("Flatten", ["/pool/GlobalAveragePool_output_0"], ["/Flatten_output_0"],
                         axis=1, name="/Flatten"),
        helper.make_node("Gemm", ["/Flatten_output_0", "classifier.weight", "classifier.bias"],
                         ["logits"], alpha=1.0, beta=1.0, transB=1, name="/classifier/Gemm")]
    graph = helper.make_graph(
        nodes, "main_graph", [helper.make_tensor_value_info("input", 1, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("logits", 1, [1, 10])], inits)
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)],
                             producer_name="pytorch", producer_version="2.14.0")


class _Reader(CalibrationDataReader):
    def __init__(self, samples):
        self.samples = iter(samples)

    def get_next(self):
        sample = next(self.samples, None)
        return None if sample is None else {"input": sample}


def ort_ranges(path, folder, method, samples) -> "dict[str, tuple[float, float]]":
    """onnxruntime's calibrated range of every float tensor of the model at ``path``."""
    kind, options = ORT[method]
    with contextlib.redirect_stdout(io.StringIO()):       # the collector prints its progress
        calibrator = create_calibrator(path, augmented_model_path=str(folder / "aug.onnx"),
                                       calibrate_method=kind, extra_options=options)
        calibrator.collect_data(_Reader(samples))
        data = calibrator.compute_data()
    return {name: tuple(float(v) for v in data[name].range_value) for name in data.keys()}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("calibrate")
    path = str(folder / "model.onnx")
    save(exporter_model(), path)
    samples = np.random.default_rng(1).standard_normal((32, 1, 3, 32, 32)).astype(np.float32)
    return folder, path, samples


@pytest.mark.parametrize("method", ["percentile", "entropy"])
def test_ranges_equal_onnxruntime_calibrator(exported, method):
    """onnxruntime's calibrator (create_calibrator on the float model, the same 32 samples,
    one per run) and hwonnx give the same range to every tensor both calibrate (the input,
    each Conv+Relu and the Gemm). Tolerance: 1e-5 of the tensor's largest magnitude. The two
    compute the float values with different kernels (onnxruntime's MLAS convolution, hwonnx's
    NumPy evaluator: other summation orders), which moves values, hence the histogram edges,
    in their last float32 bits; the same arrays give equal ranges exactly
    (``test_same_arrays_give_onnxruntime_ranges_exactly``)."""
    folder, path, samples = exported
    expected = ort_ranges(path, folder, method, samples)
    graph = load_model(path)
    values = evaluate_float(graph, calibration_feeds(graph, {"input": samples}), keep_all=True)
    compared = {"input", "/features/features.1/Relu_output_0",
                "/features/features.4/Relu_output_0", "logits"}
    assert compared <= set(expected) & set(values)
    minmax_differs = False
    for name in compared:
        got = calibrated_range(values[name], method)
        tolerance = 1e-5 * max(abs(v) for v in expected[name])
        np.testing.assert_allclose(got, expected[name], rtol=0, atol=tolerance, err_msg=name)
        minmax_differs |= got != (values[name].min(), values[name].max())
    assert minmax_differs               # the method clipped some tensor: not min/max again

    # the quantized graph's layers use those ranges: scale (hi - lo) / 255 over [lo, hi] with
    # 0 in it (int8 asymmetric)
    int_graph = quantize_model(graph, {"input": samples}, method)
    scales = {n.outputs[0][:-2]: n.attrs.get("out_scale", n.attrs.get("scale"))
              for n in int_graph.nodes if n.outputs and n.outputs[0].endswith(":q")}
    for name in compared:
        lo, hi = min(expected[name][0], 0.0), max(expected[name][1], 0.0)
        assert scales[name] == pytest.approx((hi - lo) / 255, rel=1e-5), name


@pytest.mark.parametrize("method", ["percentile", "entropy"])
@pytest.mark.parametrize("shape", ["normal", "relu", "heavy", "skewed"])
def test_same_arrays_give_onnxruntime_ranges_exactly(method, shape):
    """On the same float32 arrays, onnxruntime's HistogramCollector (the settings of ``ORT``:
    symmetric percentile histogram of 2,048 bins, 99.999; entropy over 2,048 bins into 128)
    and hwonnx give the same range, bit for bit."""
    rng = np.random.default_rng(2)
    data = {"normal": rng.standard_normal(60000), "relu": np.maximum(rng.normal(0.3, 1, 60000), 0),
            "heavy": rng.standard_t(2, 60000), "skewed": rng.exponential(1, 60000) - 0.2}[shape]
    runs = list(data.astype(np.float32).reshape(20, 3000))   # one array per run, as collected
    collector = HistogramCollector(method, method == "percentile", 2048, 128, 99.999, "same")
    with contextlib.redirect_stdout(io.StringIO()):
        collector.collect({"t": runs})
        lo, hi = collector.compute_collection_result()["t"][:2]
    assert calibrated_range(np.stack(runs), method) == (float(lo), float(hi))


def _int8_mse(data: np.ndarray, lo: float, hi: float) -> float:
    """Mean squared error of int8 asymmetric quantization over ``[lo, hi]`` with 0 in it."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / 255
    zp = np.clip(np.round(-128 - lo / scale), -128, 127)
    q = np.clip(np.rint(data / scale) + zp, -128, 127)
    return float(np.mean(((q - zp) * scale - data) ** 2))


@pytest.mark.parametrize("shape", ["normal", "laplace", "relu", "uniform", "t3"])
def test_mse_range_has_the_smallest_quantization_error(shape):
    """Brute force on the values themselves (not a histogram): the int8 quantization error of
    hwonnx's mse range is within 3 % of the smallest over the same 256 candidate ranges
    (share k / 256 of the min/max range); heavy tails are clipped, a uniform distribution is
    not (more than 99 % of its range kept)."""
    rng = np.random.default_rng(3)
    data = {"normal": rng.standard_normal(100000), "laplace": rng.laplace(size=100000),
            "relu": np.maximum(rng.standard_normal(100000), 0),
            "uniform": rng.uniform(-1, 2, 100000), "t3": rng.standard_t(3, 100000)}[shape]
    data = data.astype(np.float32).astype(np.float64)
    lo, hi = calibrated_range(data, "mse")
    full_lo, full_hi = min(data.min(), 0.0), max(data.max(), 0.0)
    best = min(_int8_mse(data, k / 256 * full_lo, k / 256 * full_hi) for k in range(1, 257))
    assert _int8_mse(data, lo, hi) <= 1.03 * best
    kept = hi / full_hi
    assert kept > 0.99 if shape == "uniform" else kept < 0.95


def test_minmax_is_the_default_and_unchanged():
    """minmax: the smallest and largest value, exactly."""
    data = np.random.default_rng(4).standard_normal(1000).astype(np.float32)
    assert calibrated_range(data) == (float(data.min()), float(data.max()))
    assert METHODS[0] == "minmax"


def test_unknown_method_is_refused(exported, tmp_path, capsys):
    _, path, samples = exported
    message = "Calibration method must be one of minmax, percentile, entropy, mse, not 'kl'"
    with raises(UsageError, message):
        api.build(path, None, calib={"input": samples[:2]}, calibrate="kl")
    with pytest.raises(SystemExit) as stop:
        main(["build", path, "-o", str(tmp_path / "out"), "--calibrate", "kl"])
    assert stop.value.code == 2
    assert "argument --calibrate: invalid choice: 'kl' (choose from 'minmax', 'percentile', " \
           "'entropy', 'mse')" in capsys.readouterr().err
