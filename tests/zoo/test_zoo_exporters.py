"""The exporter-style zoo (hwonnx.zoo.exporters): valid ONNX as tf2onnx and PyTorch lay it out,
read into the float ops hwonnx should make of it, and run on the RTL bit-exact with golden in
the predicted cycles, the int8 result near onnxruntime's reference path on the float model."""

import numpy as np
import onnx
import pytest

from hwonnx.api import build, simulate
from hwonnx.frontend import load_model
from hwonnx.zoo import random_inputs
from hwonnx.zoo.exporters import EXPORTER_STYLE
from ort_reference import reference_session

NAMES = sorted(EXPORTER_STYLE)
#: The float graph after the passes: tf2onnx's Transpose pairs cancel (the first, on the
#: input, is a host step) and its Flatten Transpose folds into the Dense; BatchNorm1d folds
#: into its Linear through Unsqueeze/Squeeze; the U-Net keeps its Resize and ConvTranspose.
FLOAT_OPS = {
    "keras_nhwc_cnn": ["Transpose", "Conv", "Conv", "Conv", "Reshape", "Dense", "Softmax"],
    "torch_mlp_bn1d": ["Dense", "Reshape", "Reshape", "Dense", "Reshape", "Reshape", "Dense"],
    "autoencoder_two_outputs": ["Dense", "Dense", "Dense", "Dense"],
    # [N, C, L] as [N, C, 1, L] (the first Reshape on the host), BatchNorm1d folded
    "audio_cnn_1d": ["Reshape", "Conv", "MaxPool", "Conv", "AvgPool", "Reshape", "Flatten",
                     "Dense"],
    # HardSwish tables, the SE gate's Mul on the element-wise engine (Eltwise)
    "mobilenet_v3_style": ["Conv", "HardSwish", "Conv", "AvgPool", "Conv", "Conv",
                           "HardSigmoid", "Eltwise", "Conv", "Add", "Conv", "HardSwish",
                           "Conv", "HardSwish", "Conv", "AvgPool", "Flatten", "Dense",
                           "HardSwish", "Dense"],
    # SiLU (Sigmoid, Mul) is one Swish table each; the C2f Split is two Slices
    "tiny_yolo_style": ["Conv", "Swish", "Conv", "Swish", "Conv", "Swish", "Slice", "Slice",
                        "Conv", "Swish", "Conv", "Swish", "Add", "Concat", "Conv", "Swish",
                        "Conv", "ConvTranspose", "Concat", "Conv", "Swish", "Conv"],
    "tiny_unet": ["Conv", "Conv", "MaxPool", "Conv", "MaxPool", "Conv", "ConvTranspose",
                  "Conv", "Concat", "Conv", "ConvTranspose", "Concat", "Conv", "Conv"],
}


@pytest.mark.parametrize("name", NAMES)
def test_valid_onnx_read_into_the_expected_float_ops(name):
    model = EXPORTER_STYLE[name]()
    onnx.checker.check_model(model, full_check=True)
    assert [n.op for n in load_model(model).nodes] == FLOAT_OPS[name]


def _reference(model, x: np.ndarray) -> "dict[str, np.ndarray]":
    """Every output of onnxruntime's reference path, by name, samples along axis 0."""
    session = reference_session(model)
    batch = model.graph.input[0].type.tensor_type.shape.dim[0].dim_value
    step = batch if batch != 1 else 1
    runs = [session.run(None, {"input": x[i:i + step] if batch != 1 else x[i]})
            for i in range(0, len(x), step)]
    return {o.name: np.concatenate(parts)
            for o, parts in zip(model.graph.output, zip(*runs))}


@pytest.mark.rtl
@pytest.mark.parametrize("name", NAMES)
def test_zoo_model_on_rtl(name, tmp_path):
    """Bit-exact with golden in the predicted cycles; against the float model (random weights,
    int8 chains of up to 20 layers, inputs outside the 256 calibration samples) the 99th
    percentile of the error is within 5% of the output's range, the mean within 2% and the
    largest within 10% (measured: at most 2.7%, 0.98% and 5.1%, bench/results/zoo.md)."""
    model = EXPORTER_STYLE[name]()
    result = build(model, tmp_path / "build", calib=random_inputs(model, 256, 0),
                   log=lambda m: None)
    inputs = random_inputs(model, 8, 1)
    rtl = simulate(tmp_path / "build", inputs, mode="compare", log=lambda m: None)
    golden = simulate(result, inputs, mode="golden")
    assert golden.outputs.keys() == {o.name for o in model.graph.output}
    assert rtl.int_values.keys() == golden.int_values.keys()
    for value in rtl.int_values:
        np.testing.assert_array_equal(rtl.int_values[value], golden.int_values[value])
    assert rtl.cycles == [rtl.predicted_cycles] * len(rtl.cycles)
    for name, want in _reference(model, inputs["input"]).items():
        error = np.abs(golden.outputs[name].reshape(want.shape) - want) / np.abs(want).max()
        assert np.percentile(error, 99) <= 0.05 and error.mean() <= 0.02, name
        assert error.max() <= 0.10, name
