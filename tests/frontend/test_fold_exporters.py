"""The constant subgraphs exporters write, folded at load time (issue 38): torch.onnx's class
token (``ConstantOfShape -> Mul -> Equal -> Where -> Expand``) and patch-embedding reshape
(``Shape -> Slice -> Concat -> Reshape``) as timm's DeiT export writes them, and a BERT-style
embedding's position and token-type ids (``Shape -> Gather -> Unsqueeze -> Slice``,
``Expand``, ``Range``) and default attention mask (``ConstantOfShape -> Unsqueeze -> Cast ->
Sub -> Mul``). Each folded value must equal onnx's reference evaluator on the same model; a
subgraph that reads a run-time value is not folded; a ``Gather`` of a computed tensor by a run
of consecutive indices (the class token ``x[:, 0]``) is a ``Slice``."""

import re

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from hwonnx.errors import ModelError, UnsupportedOperatorError
from hwonnx.frontend.fold import fold_constants
from hwonnx.frontend.load import load_model
from hwonnx.frontend.shapes import infer_shapes, value_types
from hwonnx.ir.evaluate import evaluate_float

INT64 = TensorProto.INT64


def const(name, value):
    """A ``Constant`` node as torch.onnx writes it (``/C_3`` makes ``/C_3_output_0``)."""
    return helper.make_node("Constant", [], [f"{name}_output_0"], name=name,
                            value=numpy_helper.from_array(np.asarray(value)))


def class_token_nodes(tokens: str, out: str, dim: int):
    """timm's ``torch.cat((self.cls_token.expand(B, -1, -1), x), dim=1)`` + ``pos_embed`` as
    torch.onnx (opset 17) writes it with a static batch: the ``expand`` sizes (-1 meaning
    "keep") resolved by ``Where(Equal(sizes, -1), 1, sizes)``."""
    return [
        const("/Constant_1", np.array([1, -1, -1], np.int64)),
        const("/Constant_2", np.array([3], np.int64)),
        helper.make_node("ConstantOfShape", ["/Constant_2_output_0"],
                         ["/ConstantOfShape_output_0"], name="/ConstantOfShape",
                         value=numpy_helper.from_array(np.array([1], np.int64))),
        const("/Constant_3", np.array(-1, np.int64)),
        helper.make_node("Mul", ["/ConstantOfShape_output_0", "/Constant_3_output_0"],
                         ["/Mul_output_0"], name="/Mul"),
        helper.make_node("Equal", ["/Constant_1_output_0", "/Mul_output_0"],
                         ["/Equal_output_0"], name="/Equal"),
        helper.make_node("Where", ["/Equal_output_0", "/ConstantOfShape_output_0",
                                   "/Constant_1_output_0"], ["/Where_output_0"], name="/Where"),
        helper.make_node("Expand", ["cls_token", "/Where_output_0"], ["/Expand_output_0"],
                         name="/Expand"),
        helper.make_node("Concat", ["/Expand_output_0", tokens], ["/Concat_output_0"],
                         name="/Concat", axis=1),
        helper.make_node("Add", ["/Concat_output_0", "pos_embed"], [out], name="/Add"),
    ]


def deit_embedding(dim=8, patch=4, size=8):
    """DeiT's patch embedding, class token and position embedding, node for node as the
    timm export writes them (``/patch_embed/Shape`` ... ``/Add``), to a graph output."""
    tokens = (size // patch) ** 2
    rng = np.random.default_rng(38)
    nodes = [
        helper.make_node("Conv", ["input", "patch_embed.proj.weight", "patch_embed.proj.bias"],
                         ["/patch_embed/proj/Conv_output_0"], name="/patch_embed/proj/Conv",
                         kernel_shape=[patch, patch], strides=[patch, patch]),
        helper.make_node("Shape", ["/patch_embed/proj/Conv_output_0"],
                         ["/patch_embed/Shape_output_0"], name="/patch_embed/Shape"),
        const("/patch_embed/Constant", np.array([0], np.int64)),
        const("/patch_embed/Constant_1", np.array([0], np.int64)),
        const("/patch_embed/Constant_2", np.array([2], np.int64)),
        helper.make_node("Slice", ["/patch_embed/Shape_output_0",
                                   "/patch_embed/Constant_1_output_0",
                                   "/patch_embed/Constant_2_output_0",
                                   "/patch_embed/Constant_output_0"],
                         ["/patch_embed/Slice_output_0"], name="/patch_embed/Slice"),
        const("/patch_embed/Constant_3", np.array([-1], np.int64)),
        helper.make_node("Concat", ["/patch_embed/Slice_output_0",
                                    "/patch_embed/Constant_3_output_0"],
                         ["/patch_embed/Concat_output_0"], name="/patch_embed/Concat", axis=0),
        helper.make_node("Reshape", ["/patch_embed/proj/Conv_output_0",
                                     "/patch_embed/Concat_output_0"],
                         ["/patch_embed/Reshape_output_0"], name="/patch_embed/Reshape"),
        helper.make_node("Transpose", ["/patch_embed/Reshape_output_0"],
                         ["/patch_embed/Transpose_output_0"], name="/patch_embed/Transpose",
                         perm=[0, 2, 1]),
        *class_token_nodes("/patch_embed/Transpose_output_0", "embedded", dim),
    ]
    inits = {"patch_embed.proj.weight": rng.normal(size=(dim, 3, patch, patch)),
             "patch_embed.proj.bias": rng.normal(size=dim),
             "cls_token": rng.normal(size=(1, 1, dim)),
             "pos_embed": rng.normal(size=(1, tokens + 1, dim))}
    graph = helper.make_graph(
        nodes, "main_graph",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("embedded", TensorProto.FLOAT, [1, tokens + 1, dim])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def bert_embedding(seq=6, hidden=8, vocab=11, max_pos=16):
    """A BERT-style embedding as torch.onnx writes HF's ``BertEmbeddings`` and the default
    extended attention mask (no mask given: ``torch.ones(input_shape)``): position ids
    ``position_ids[:, 0:seq]`` from ``Shape -> Gather -> Unsqueeze -> Slice``, token-type ids
    ``token_type_ids[:, :seq].expand(1, seq)``, a ``Range`` of positions, and the mask
    ``(1.0 - mask[:, None, None, :]) * finfo.min``. The word-embedding ``Gather`` reads the
    run-time token ids."""
    rng = np.random.default_rng(7)
    p = "/embeddings"
    nodes = [
        helper.make_node("Shape", ["input_ids"], [f"{p}/Shape_output_0"], name=f"{p}/Shape"),
        const(f"{p}/Constant", np.array(1, np.int64)),
        helper.make_node("Gather", [f"{p}/Shape_output_0", f"{p}/Constant_output_0"],
                         [f"{p}/Gather_output_0"], name=f"{p}/Gather", axis=0),
        const(f"{p}/Constant_1", np.array([0], np.int64)),
        helper.make_node("Unsqueeze", [f"{p}/Gather_output_0", f"{p}/Constant_1_output_0"],
                         [f"{p}/Unsqueeze_output_0"], name=f"{p}/Unsqueeze"),
        const(f"{p}/Constant_2", np.array([0], np.int64)),
        const(f"{p}/Constant_3", np.array([1], np.int64)),
        helper.make_node("Slice", ["embeddings.position_ids", f"{p}/Constant_2_output_0",
                                   f"{p}/Unsqueeze_output_0", f"{p}/Constant_3_output_0"],
                         [f"{p}/Slice_output_0"], name=f"{p}/Slice"),
        helper.make_node("Slice", ["embeddings.token_type_ids", f"{p}/Constant_2_output_0",
                                   f"{p}/Unsqueeze_output_0", f"{p}/Constant_3_output_0"],
                         [f"{p}/Slice_1_output_0"], name=f"{p}/Slice_1"),
        helper.make_node("Expand", [f"{p}/Slice_1_output_0", f"{p}/Shape_output_0"],
                         [f"{p}/Expand_output_0"], name=f"{p}/Expand"),
        const(f"{p}/Constant_4", np.array(0, np.int64)),
        const(f"{p}/Constant_5", np.array(1, np.int64)),
        helper.make_node("Range", [f"{p}/Constant_4_output_0", f"{p}/Gather_output_0",
                                   f"{p}/Constant_5_output_0"], [f"{p}/Range_output_0"],
                         name=f"{p}/Range"),
        helper.make_node("Gather", ["embeddings.word_embeddings.weight", "input_ids"],
                         [f"{p}/word_embeddings/Gather_output_0"],
                         name=f"{p}/word_embeddings/Gather"),
        helper.make_node("Gather", ["embeddings.token_type_embeddings.weight",
                                    f"{p}/Expand_output_0"],
                         [f"{p}/token_type_embeddings/Gather_output_0"],
                         name=f"{p}/token_type_embeddings/Gather"),
        helper.make_node("Gather", ["embeddings.position_embeddings.weight",
                                    f"{p}/Slice_output_0"],
                         [f"{p}/position_embeddings/Gather_output_0"],
                         name=f"{p}/position_embeddings/Gather"),
        helper.make_node("Add", [f"{p}/token_type_embeddings/Gather_output_0",
                                 f"{p}/position_embeddings/Gather_output_0"],
                         [f"{p}/Add_output_0"], name=f"{p}/Add"),
        helper.make_node("Add", [f"{p}/word_embeddings/Gather_output_0", f"{p}/Add_output_0"],
                         ["embedded"], name=f"{p}/Add_1"),
        helper.make_node("ConstantOfShape", [f"{p}/Shape_output_0"], ["/ConstantOfShape_output_0"],
                         name="/ConstantOfShape",
                         value=numpy_helper.from_array(np.array([1], np.int64))),
        const("/Constant", np.array([1, 2], np.int64)),
        helper.make_node("Unsqueeze", ["/ConstantOfShape_output_0", "/Constant_output_0"],
                         ["/Unsqueeze_output_0"], name="/Unsqueeze"),
        helper.make_node("Cast", ["/Unsqueeze_output_0"], ["/Cast_output_0"], name="/Cast",
                         to=TensorProto.FLOAT),
        const("/Constant_1", np.array(1.0, np.float32)),
        helper.make_node("Sub", ["/Constant_1_output_0", "/Cast_output_0"], ["/Sub_output_0"],
                         name="/Sub"),
        const("/Constant_2", np.array(np.finfo(np.float32).min, np.float32)),
        helper.make_node("Mul", ["/Sub_output_0", "/Constant_2_output_0"], ["mask"],
                         name="/Mul"),
    ]
    inits = [
        numpy_helper.from_array(np.arange(max_pos, dtype=np.int64)[None],
                                "embeddings.position_ids"),
        numpy_helper.from_array(np.zeros((1, max_pos), np.int64), "embeddings.token_type_ids"),
        *[numpy_helper.from_array(rng.normal(size=(rows, hidden)).astype(np.float32), name)
          for name, rows in (("embeddings.word_embeddings.weight", vocab),
                             ("embeddings.token_type_embeddings.weight", 2),
                             ("embeddings.position_embeddings.weight", max_pos))]]
    graph = helper.make_graph(
        nodes, "main_graph", [helper.make_tensor_value_info("input_ids", INT64, [1, seq])],
        [helper.make_tensor_value_info("embedded", TensorProto.FLOAT, [1, seq, hidden]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 1, 1, seq]),
         helper.make_tensor_value_info("/embeddings/Range_output_0", INT64, [seq])], inits)
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def folded(model):
    """The frontend's folding of ``model`` (shape inference, then :func:`fold_constants`):
    the nodes kept for run time and the constants."""
    model = infer_shapes(model)
    return fold_constants(model, value_types(model))


def reference(model, feeds, names):
    return dict(zip(names, ReferenceEvaluator(model).run(list(names), feeds)))


def test_deit_class_token_and_patch_reshape_fold_to_the_reference_values():
    model = deit_embedding()
    kept, constants = folded(model)
    # what is left is the run-time data path: nothing of the shape arithmetic
    assert [n.op_type for n in kept] == ["Conv", "Reshape", "Transpose", "Concat", "Add"]
    names = ["/Where_output_0", "/Expand_output_0", "/patch_embed/Concat_output_0"]
    x = np.random.default_rng(0).normal(size=(1, 3, 8, 8)).astype(np.float32)
    expected = reference(model, {"input": x}, names)
    np.testing.assert_array_equal(expected["/Where_output_0"], [1, 1, 1])   # -1: keep (1)
    for name in names:
        assert constants[name].dtype == expected[name].dtype, name
        np.testing.assert_array_equal(constants[name], expected[name], err_msg=name)
    assert constants["/Expand_output_0"].shape == (1, 1, 8)


def test_bert_position_and_type_ids_and_default_mask_fold_to_the_reference_values():
    model = bert_embedding()
    kept, constants = folded(model)
    # only the word-embedding lookup and the Adds after it read the run-time ids
    assert [n.name for n in kept] == ["/embeddings/word_embeddings/Gather", "/embeddings/Add_1"]
    ids = np.array([[3, 1, 4, 1, 5, 9]], np.int64)
    names = ["/embeddings/Slice_output_0", "/embeddings/Expand_output_0",
             "/embeddings/Range_output_0", "/embeddings/Add_output_0", "mask"]
    expected = reference(model, {"input_ids": ids}, names)
    np.testing.assert_array_equal(expected["/embeddings/Range_output_0"], np.arange(6))
    np.testing.assert_array_equal(expected["mask"], np.zeros((1, 1, 1, 6)))
    for name in names:
        assert constants[name].dtype == expected[name].dtype, name
        np.testing.assert_array_equal(constants[name], expected[name], err_msg=name)


def test_bert_token_lookup_is_refused_by_name():
    """The word-embedding ``Gather`` reads the run-time token ids (issue 38's host prefix is
    not there yet): the int64 input is refused, and with a float input of ids the lookup is
    refused by node, not folded."""
    with pytest.raises(ModelError, match=re.escape(
            "Graph input 'input_ids' must be float32, float16, bfloat16 or float64, not int64")):
        load_model(bert_embedding())
    model = bert_embedding()
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT
    with pytest.raises(UnsupportedOperatorError, match=re.escape(
            "(Gather '/embeddings/word_embeddings/Gather' needs a constant index tensor, but "
            "'input_ids' is computed at run time")):
        load_model(model)


def test_a_subgraph_reading_runtime_values_is_not_folded():
    """``Expand`` of a computed tensor is no constant: it is refused by name, not evaluated."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             *class_token_nodes("r", "y", 4)[:7],
             helper.make_node("Expand", ["r", "/Where_output_0"], ["y"], name="/Expand")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4])])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    kept, constants = folded(model)
    assert [n.name for n in kept] == ["relu", "/Expand"] and "/Where_output_0" in constants
    with pytest.raises(UnsupportedOperatorError, match=re.escape(
            "(Expand '/Expand' is folded away, so its inputs must be constants, but 'r' is "
            "computed at run time)")):
        load_model(model)


@pytest.mark.parametrize("op, inputs, message", [
    ("ConstantOfShape", [np.array([1 << 20, 1 << 20], np.int64)],
     "its result could have up to 1099511627776 elements"),
    ("Range", [np.array(0, np.int64), np.array(1 << 40, np.int64), np.array(1, np.int64)],
     "its result could have up to 1099511627776 elements"),
    ("Expand", [np.zeros(1, np.float32), np.array([1 << 16, 1 << 16], np.int64)],
     "its result could have up to 4294967296 elements"),
    ("Tile", [np.zeros((2, 2), np.float32), np.array([1 << 16, 1 << 16], np.int64)],
     "its result could have up to 17179869184 elements"),
])
def test_a_folded_result_too_large_is_refused_before_it_is_made(op, inputs, message):
    names = [f"c{i}" for i in range(len(inputs))]
    graph = helper.make_graph(
        [helper.make_node(op, names, ["big"], name="big"),
         helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("big", TensorProto.INT64 if op == "Range" else
                                       TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, n) for n, v in zip(names, inputs)])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelError, match=re.escape(f"Cannot fold constant node 'big' ({op}): "
                                                   f"{message}")):
        folded(model)


def gather_model(index, axis):
    """Conv -> Gather(axis, constant index) -> Flatten -> Gemm: the class token's pick, on an
    image so that the array maps it."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[1, 1]),
             helper.make_node("Gather", ["c", "index"], ["g"], name="/Gather", axis=axis),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "w2"], ["y"], name="head")]
    shape = [1, 4, 3, 5]
    picked = (*shape[:axis], *np.shape(index), *shape[axis + 1:])
    inits = [numpy_helper.from_array(rng.normal(size=(4, 4, 1, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(np.asarray(index, np.int64), "index"),
             numpy_helper.from_array(rng.normal(size=(int(np.prod(picked[1:])), 3))
                                     .astype(np.float32), "w2")]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
                              inits)
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("index, axis", [(0, 2), (np.int64(-1), 3), ([1, 2], 1), ([2], 2),
                                         ([[0, 1]], 3)])
def test_gather_of_a_computed_tensor_by_a_run_of_indices_is_a_slice(index, axis):
    model = gather_model(index, axis)
    graph = load_model(model)
    assert "Slice" in [n.op for n in graph.nodes]
    x = np.random.default_rng(1).normal(size=(1, 4, 3, 5)).astype(np.float32)
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})[0]
    got = evaluate_float(graph, {"x": x})["y"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_gather_of_scattered_indices_is_refused_by_name():
    with pytest.raises(UnsupportedOperatorError, match=re.escape(
            "(Gather '/Gather' picks indices [0, 2] along axis 1; only a run of consecutive "
            "increasing indices (a Slice) is mapped)")):
        load_model(gather_model([0, 2], 1))


@pytest.mark.parametrize("index", [5, -6])
def test_gather_of_an_index_out_of_range_is_refused_by_name(index):
    with pytest.raises(ModelError, match="^" + re.escape(
            f"Gather '/Gather' reads index {index} along axis 3 of its input of shape "
            f"[1, 4, 3, 5]; ONNX takes indices in [-5, 4]") + "$"):
        load_model(gather_model([index], 3))
