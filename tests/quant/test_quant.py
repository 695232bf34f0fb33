"""Post-training quantization: activation and requantization parameters, the quantized
digits_mlp, and reading sample files."""

import math
import re
from fractions import Fraction

import numpy as np
import onnxruntime as ort
import pytest

from hwonnx.errors import QuantizationError
from hwonnx.examples import example_path
from hwonnx.frontend import load_model
from hwonnx.golden import dequantize, evaluate, quantize
from hwonnx.ir import Graph, TensorType
from hwonnx.quant import (activation_params, load_samples, normalize_samples, quantize_graph,
                          requant_params)

from helpers import raises


# activation_params --------------------------------------------------------------------------

def activation_ranges():
    rng = np.random.default_rng(0)
    ranges = [(-1.0, 1.0), (0.0, 6.0), (-3.0, 0.0), (0.5, 2.0), (-2.0, -0.5), (-1e-3, 1e3),
              (-1e3, 1e-3), (-0.1, 0.1 + 1e-7)]
    for _ in range(200):
        a, b = rng.standard_normal(2) * 10.0 ** rng.uniform(-4, 4, 2)
        ranges.append((min(a, b), max(a, b)))
    return ranges


def test_activation_params_cover_the_range_and_zero_exactly():
    for lo, hi in activation_ranges():
        scale, zp = activation_params(lo, hi)
        assert isinstance(zp, int) and -128 <= zp <= 127
        assert scale > 0
        # real zero is represented exactly: it quantizes to the zero point and back to 0
        assert quantize(np.zeros(1, np.float32), scale=scale, zero_point=zp)[0] == zp
        assert dequantize(np.array([zp], np.int8), scale=scale, zero_point=zp)[0] == 0.0
        # every value of [min(lo, 0), max(hi, 0)] is within half a step of a code: no clipping
        ends = np.array([min(lo, 0.0), max(hi, 0.0), lo, hi], np.float32)
        back = dequantize(quantize(ends, scale=scale, zero_point=zp), scale=scale,
                          zero_point=zp)
        assert np.all(np.abs(back.astype(np.float64) - ends) <= scale * (0.5 + 1e-4)), (lo, hi)
        # and the 256 codes are not wasted: the step is the range over 255
        assert math.isclose(scale * 255, max(hi, 0.0) - min(lo, 0.0), rel_tol=1e-9)


def test_activation_params_one_sided_ranges_use_the_full_code_range():
    scale, zp = activation_params(0.0, 6.0)              # after a ReLU
    assert zp == -128 and math.isclose(scale, 6.0 / 255)
    scale, zp = activation_params(-3.0, 0.0)
    assert zp == 127 and math.isclose(scale, 3.0 / 255)


def test_activation_params_empty_range_is_usable():
    scale, zp = activation_params(0.0, 0.0)
    assert scale > 0 and -128 <= zp <= 127
    assert quantize(np.zeros(3, np.float32), scale=scale, zero_point=zp).tolist() == [zp] * 3


# requant_params --------------------------------------------------------------------------------

def test_requant_params_reconstructs_the_multiplier():
    rng = np.random.default_rng(1)
    real = 2.0 ** rng.uniform(-33, 29.9, 2000)
    real[:6] = [2.0 ** -33, 1.0, 0.5, 1 - 2.0 ** -40, 2.0 ** 29, (2 ** 31 - 1) / 2 ** 31]
    mult, shift = requant_params(real, "layer")
    assert mult.shape == shift.shape == real.shape
    for r, m, s in zip(real, mult.tolist(), shift.tolist()):
        assert (1 << 30) <= m < (1 << 31) and 1 <= s <= 63
        error = abs(Fraction(m, 1 << s) - Fraction(r)) / Fraction(r)
        assert error <= Fraction(1, 1 << 30), (r, m, s)


def test_requant_params_zero_multiplier():
    mult, shift = requant_params(np.array([0.0, 0.25]), "layer")
    assert mult[0] == 0 and 1 <= shift[0] <= 63
    assert Fraction(int(mult[1]), 1 << int(shift[1])) == Fraction(1, 4)


@pytest.mark.parametrize("value, text", [
    (2.0 ** 31, "2.15e+09"), (2.0 ** 30, "1.07e+09"), (2.0 ** -40, "9.09e-13"),
    (2.0 ** -33 * (1 - 2.0 ** -20), "1.16e-10"),
])
def test_requant_params_rejects_out_of_range_scales(value, text):
    with raises(QuantizationError,
                f"Layer 'conv7': requantization scale {text} of channel 2 is outside what a "
                f"31-bit multiplier and a shift of 1..63 can express"):
        requant_params(np.array([0.5, 1e-3, value, 1.0]), "conv7")


# quantize_graph on digits_mlp --------------------------------------------------------------

@pytest.fixture(scope="module")
def mlp(digits):
    float_graph = load_model(example_path("digits_mlp"))
    calib = normalize_samples(float_graph, {"image": digits["calib"]}, "Calibration data")
    return float_graph, quantize_graph(float_graph, calib)


def test_quantized_mlp_structure(mlp):
    float_graph, graph = mlp
    assert [n.op for n in graph.nodes] == ["Quantize", "QDense", "QDense", "Dequantize"]
    assert graph.inputs == ("image",) and graph.outputs == ("logits",)
    graph.verify()
    float_dense = [n for n in float_graph.nodes if n.op == "Dense"]
    for node, float_node in zip(graph.nodes[1:3], float_dense):
        w, bias, mult, shift = (graph.constants[v] for v in node.inputs[1:5])
        w_float = float_graph.constants[float_node.inputs[1]].astype(np.float64)    # [K, N]
        assert w.dtype == np.int8 and w.shape == w_float.shape
        assert w.min() >= -127 and w.max() <= 127
        assert np.abs(w).max(axis=0).tolist() == [127] * w.shape[1]    # symmetric, per channel
        assert bias.dtype == np.int32 and bias.shape == (w.shape[1],)
        # weights: w_float ~= w * s_w, with s_w = max |w_float| / 127 per output channel
        s_w = np.abs(w_float).max(axis=0) / 127
        assert np.all(np.abs(w * s_w - w_float) <= s_w / 2 + 1e-7)
        # requantization: mult * 2**-shift == in_scale * s_w / out_scale
        attrs = node.attrs
        real = attrs["in_scale"] * s_w / attrs["out_scale"]
        np.testing.assert_allclose(mult.astype(np.float64) * 2.0 ** -shift.astype(np.float64),
                                   real, rtol=2.0 ** -29)
        # bias in units of in_scale * s_w
        b_float = float_graph.constants[float_node.inputs[2]]
        np.testing.assert_allclose(bias * attrs["in_scale"] * s_w, b_float,
                                   atol=float((attrs["in_scale"] * s_w).max()))
    hidden = graph.nodes[1]
    assert hidden.attrs["relu"] and hidden.attrs["lo"] == hidden.attrs["out_zp"]


def test_quantized_mlp_accuracy_close_to_float(mlp, digits):
    _, graph = mlp
    images, labels = digits["test_images"], digits["test_labels"]
    session = ort.InferenceSession(str(example_path("digits_mlp")),
                                   providers=["CPUExecutionProvider"])
    float_logits = session.run(None, {"image": images})[0]
    float_accuracy = (float_logits.argmax(axis=1) == labels).mean()
    logits = evaluate(graph, {"image": images})["logits"]
    assert logits.shape == (len(labels), 10) and logits.dtype == np.float32
    accuracy = (logits.argmax(axis=1) == labels).mean()
    assert float_accuracy > 0.9
    assert abs(accuracy - float_accuracy) <= 0.02
    # the logits themselves are close, not just their argmax
    out_scale = graph.nodes[-1].attrs["scale"]
    assert np.median(np.abs(logits - float_logits)) < 4 * out_scale


# load_samples ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mlp_graph():
    return load_model(example_path("digits_mlp"))


@pytest.fixture
def batch():
    return np.random.default_rng(2).uniform(0, 1, (5, 64)).astype(np.float32)


def check_batch(samples, batch):
    assert list(samples) == ["image"]
    assert samples["image"].dtype == np.float32 and samples["image"].shape == (5, 1, 64)
    np.testing.assert_array_equal(samples["image"].reshape(5, 64), batch)


@pytest.mark.parametrize("leading_one", [False, True])
def test_load_samples_npz_keyed_by_input(tmp_path, mlp_graph, batch, leading_one):
    data = batch.reshape(5, 1, 64) if leading_one else batch
    np.savez(tmp_path / "c.npz", image=data)
    check_batch(load_samples(tmp_path / "c.npz", mlp_graph), batch)


@pytest.mark.parametrize("leading_one", [False, True])
def test_load_samples_npy(tmp_path, mlp_graph, batch, leading_one):
    np.save(tmp_path / "c.npy", batch.reshape(5, 1, 64) if leading_one else batch)
    check_batch(load_samples(tmp_path / "c.npy", mlp_graph), batch)


def test_load_samples_folder_of_input_files(tmp_path, mlp_graph, batch):
    np.save(tmp_path / "image.npy", batch.astype(np.float64))
    check_batch(load_samples(tmp_path, mlp_graph), batch)


def test_load_samples_folder_of_sample_files(tmp_path, mlp_graph, batch):
    for i, sample in enumerate(batch):
        np.save(tmp_path / f"sample{i:03d}.npy", sample)
    check_batch(load_samples(tmp_path, mlp_graph), batch)


def two_input_graph():
    types = {"a": TensorType("float32", (1, 3)), "b": TensorType("float32", (1, 2, 4, 4))}
    return Graph((), ("a", "b"), (), types)


def test_normalize_samples_two_inputs():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((4, 1, 2, 4, 4))
    samples = normalize_samples(two_input_graph(), {"b": b, "a": a}, "Data")
    assert samples["a"].shape == (4, 1, 3) and samples["b"].shape == (4, 1, 2, 4, 4)


def test_missing_input_name(tmp_path, mlp_graph, batch):
    path = tmp_path / "c.npz"
    np.savez(path, images=batch, other=batch)
    with raises(QuantizationError, f"Sample file '{path}' has no array for graph input(s) "
                                   f"'image'; it has 'images', 'other'"):
        load_samples(path, mlp_graph)


def test_missing_inputs_are_all_listed():
    with raises(QuantizationError, "Data has no array for graph input(s) 'a', 'b'; it has "
                                   "none"):
        normalize_samples(two_input_graph(), {}, "Data")


@pytest.mark.parametrize("shape", [(5, 63), (5, 2, 64), (64,), (5, 1, 1, 64), (5, 8, 8)])
def test_wrong_shape_names_the_input(tmp_path, mlp_graph, shape):
    path = tmp_path / "c.npy"
    np.save(path, np.zeros(shape, np.float32))
    with raises(QuantizationError,
                f"Sample file '{path}': array 'image' has shape {shape}, but samples of input "
                f"'image' (1, 64) need shape (S, 1, 64) or (S, 64)"):
        load_samples(path, mlp_graph)


def test_calibration_file_wording(tmp_path, mlp_graph):
    path = tmp_path / "c.npy"
    np.save(path, np.zeros((5, 65), np.float32))
    with raises(QuantizationError,
                f"Calibration file '{path}': array 'image' has shape (5, 65), but samples of "
                f"input 'image' (1, 64) need shape (S, 1, 64) or (S, 64)"):
        load_samples(path, mlp_graph, "Calibration file")


def test_wrong_suffix(tmp_path, mlp_graph, batch):
    path = tmp_path / "c.csv"
    np.savetxt(path, batch)
    with raises(QuantizationError, f"Sample file '{path}' must be an .npz, an .npy or a "
                                   f"folder of .npy files"):
        load_samples(path, mlp_graph)


def test_missing_file(tmp_path, mlp_graph):
    path = tmp_path / "nope.npz"
    with raises(QuantizationError, f"Sample file '{path}' does not exist"):
        load_samples(path, mlp_graph)


def test_empty_folder(tmp_path, mlp_graph):
    with raises(QuantizationError, f"Sample file folder '{tmp_path}' holds no .npy files"):
        load_samples(tmp_path, mlp_graph)


def test_unreadable_npy(tmp_path, mlp_graph):
    path = tmp_path / "c.npy"
    path.write_bytes(b"not a numpy file at all")
    with pytest.raises(QuantizationError,
                       match="^" + re.escape(f"Cannot read sample file '{path}': ") + r".+$"):
        load_samples(path, mlp_graph)


def test_single_npy_for_two_inputs(tmp_path):
    path = tmp_path / "c.npy"
    np.save(path, np.zeros((2, 3)))
    with raises(QuantizationError, f"Sample file '{path}' is a single .npy, but the model "
                                   f"has 2 inputs; use an .npz keyed by input name"):
        load_samples(path, two_input_graph())


def test_no_samples(tmp_path, mlp_graph):
    path = tmp_path / "c.npy"
    np.save(path, np.zeros((0, 64), np.float32))
    with raises(QuantizationError, f"Sample file '{path}': array 'image' holds no samples"):
        load_samples(path, mlp_graph)


def test_non_numeric_samples(tmp_path, mlp_graph):
    path = tmp_path / "c.npy"
    np.save(path, np.full((2, 64), "x"))
    with raises(QuantizationError,
                f"Sample file '{path}': array 'image' has dtype <U1, not a number type"):
        load_samples(path, mlp_graph)


def test_different_sample_counts():
    with raises(QuantizationError, "Data: inputs have different sample counts (4 and 3)"):
        normalize_samples(two_input_graph(), {"a": np.zeros((4, 3)),
                                              "b": np.zeros((3, 2, 4, 4))}, "Data")


# Regressions: user errors that once escaped as tracebacks or misread input ----------------

def test_load_samples_folder_with_an_extra_file_reads_the_input_file(tmp_path, mlp_graph,
                                                                     batch):
    """A folder of ``<input>.npy`` files (the documented format) that also holds another
    .npy: for a single-input model every file is taken as one sample and concatenated, so
    ``image.npy`` next to ``labels.npy`` fails (or is silently mis-read when shapes match)."""
    np.save(tmp_path / "image.npy", batch)
    np.save(tmp_path / "labels.npy", np.arange(5))
    check_batch(load_samples(tmp_path, mlp_graph), batch)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_calibration_data_must_be_finite(mlp_graph, digits, bad):
    """NaN or inf in calibration data is a user error; it crashes with ValueError ('cannot
    convert float NaN to integer' in activation_params) after RuntimeWarnings."""
    calib = digits["calib"].copy()
    calib[3, 5] = bad
    samples = normalize_samples(mlp_graph, {"image": calib}, "Calibration data")
    with pytest.raises(QuantizationError, match=r"^.*'image'.*$"):
        quantize_graph(mlp_graph, samples)
