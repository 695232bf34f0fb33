"""``hwonnx.inspect``: the text ``hwonnx inspect`` prints shows what the frontend read."""

import onnx
from onnx import helper

from hwonnx.examples import example_path
from hwonnx.inspect import inspect_model

from spec_helpers import make_model, rand


def test_inspect_shows_versions_metadata_signature_and_notes(tmp_path):
    model = make_model([helper.make_node("MatMul", ["input.1", "w"], ["m"], name="fc"),
                        helper.make_node("Relu", ["m"], ["y"])],
                       {"input.1": ["N", "K"]}, {"y": ["N", 2]}, {"w": rand(5, 2)}, opset=11,
                       ir=7, producer_name="exporter", producer_version="2.0", model_version=3,
                       doc_string="Two  layers\nof doc", domain="org.example")
    helper.set_model_props(model, {"model_author": "Ada", "model_license": "MIT",
                                   "dataset": "digits"})
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    text = inspect_model(path, input_shapes={"input.1": (1, 5)})
    assert text == "\n".join([
        "Model: model.onnx",
        "  IR version:    7",
        "  Opsets:        ai.onnx 11",
        "  Producer:      exporter 2.0",
        "  Domain:        org.example",
        "  Model version: 3",
        "  Graph:         test",
        "  Doc:           Two layers of doc",
        "  model_author:  Ada",
        "  model_license: MIT",
        "  Metadata:",
        "    dataset: digits",
        "Inputs:",
        "  input.1: float32 1x5 (declared NxK)",
        "Outputs:",
        "  y: float32 1x2 (declared Nx2)",
        "Dimension variables: N=1, K=5",
        "Float graph: 1 node(s) (Dense 1), 1 constant(s), 10 parameters",
        "Notes:",
        "  - Converted ai.onnx opset 11 to 13 with onnx's version converter",
        "Warnings:",
        "  - 1 name(s) do not follow C identifier syntax, e.g. 'input.1'; accepted as they are "
        "(ONNX IR: all names MUST adhere to C identifier syntax)",
    ])


def test_inspect_bundled_example():
    text = inspect_model(example_path("digits_cnn"))
    assert text.startswith("Model: digits_cnn.onnx\n  IR version:    7\n")
    assert "  image: float32 1x1x8x8 (declared batchx1x8x8)\n" in text
    assert "Float graph: 4 node(s) (Conv 2, Flatten 1, Dense 1)" in text
