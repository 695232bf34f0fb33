"""What a newcomer meets first: the bundled examples load without a warning, ``hwonnx
inspect`` says each warning once and takes the bundled names, an empty model file is named
as such, ``simulate`` takes one array for a one-input model, and ``hwonnx boards`` is a
table whose columns line up."""

import logging
import re
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hwonnx.cli import main
from hwonnx.errors import ModelError
from hwonnx.examples import EXAMPLES, example_path
from hwonnx.examples.train_digits import clean_names
from hwonnx.frontend import load_model


def raises(error, message):
    return pytest.raises(error, match="^" + re.escape(message) + "$")


# 1. The bundled examples follow the ONNX naming rules --------------------------------------

@pytest.mark.parametrize("name", EXAMPLES)
def test_bundled_example_loads_without_any_warning(name, caplog):
    caplog.set_level(logging.DEBUG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = load_model(example_path(name))
    assert caught == []
    assert graph.meta["warnings"] == ()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert graph.inputs == ("image",) and graph.outputs == ("logits",)


def torch_named_model() -> onnx.ModelProto:
    """A model named the way the PyTorch exporter names the bundled examples."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gemm", ["image", "fc1.weight", "fc1.bias"],
                              ["/fc1/Gemm_output_0"], name="/fc1/Gemm", transB=1),
             helper.make_node("Relu", ["/fc1/Gemm_output_0"], ["logits"], name="/relu1/Relu")]
    graph = helper.make_graph(
        nodes, "main_graph", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(rng.normal(size=(3, 4)).astype(np.float32), "fc1.weight"),
         numpy_helper.from_array(rng.normal(size=3).astype(np.float32), "fc1.bias")])
    return helper.make_model(graph, ir_version=7, opset_imports=[helper.make_opsetid("", 13)])


def test_training_script_gives_c_identifier_names():
    """``train_digits.py`` renames what the exporter writes; only the names change."""
    model = torch_named_model()
    clean = clean_names(onnx.load_from_string(model.SerializeToString()))
    assert [i.name for i in clean.graph.initializer] == ["fc1_weight", "fc1_bias"]
    assert [(n.name, list(n.input), list(n.output)) for n in clean.graph.node] == [
        ("fc1_Gemm", ["image", "fc1_weight", "fc1_bias"], ["fc1_Gemm_output_0"]),
        ("relu1_Relu", ["fc1_Gemm_output_0"], ["logits"])]
    for before, after in zip(model.graph.initializer, clean.graph.initializer):
        assert after.raw_data == before.raw_data and after.dims == before.dims
    assert load_model(clean).meta["warnings"] == ()
    assert load_model(model).meta["warnings"] == (
        "5 name(s) do not follow C identifier syntax, e.g. 'fc1.weight', 'fc1.bias', "
        "'/fc1/Gemm_output_0', ...; accepted as they are (ONNX IR: all names MUST adhere to C "
        "identifier syntax)",)


# 5. An empty model file ------------------------------------------------------------------------

def test_empty_model_file_is_named_as_such(tmp_path, capsys):
    path = tmp_path / "x.onnx"
    path.write_bytes(b"")
    with raises(ModelError, f"Model file '{path}' is empty"):
        load_model(path)
    with raises(ModelError, "The model bytes are empty"):
        load_model(b"")
    assert main(["inspect", str(path)]) == 2
    assert capsys.readouterr() == ("", f"hwonnx: error: Model file '{path}' is empty\n")
