"""Activations in the external memory (hwonnx/compiler/spill.py, LOADA/STOREA in hdl/dma.py):
a model whose tensors do not fit the activation buffer keeps the largest ones in the external
memory model; the layers that read or write them run in bands of rows through windows, on the
RTL bit-exact with golden in exactly the predicted cycles."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hwonnx.api import build
from hwonnx.compiler import Op
from hwonnx.config import ArchConfig
from hwonnx.errors import ResourceError

from rtl_helpers import he_weight, rtl_matches_golden

H, W = 20, 16


def _config(act_depth: int = 400, **changes) -> ArchConfig:
    fields = dict(act_depth=act_depth, wgt_depth=4096, acc_depth=256, par_depth=64,
                  prog_depth=512, ext_memory="ulx3s-sdram", ext_depth=1 << 14)
    return ArchConfig(**{**fields, **changes})


def _model() -> onnx.ModelProto:
    """x [1, 8, 20, 16] -> Conv 3x3 8->16 + Relu -> MaxPool 3x3 stride 2 pad 1 -> Conv 3x3 +
    Relu -> Conv 3x3 -> Add (the pool's output) + Relu -> depthwise Conv 3x3 stride 2 + Relu ->
    global average pool -> Gemm 16->10."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(he_weight(rng, 16, 8, 3, 3), "w0"),
             numpy_helper.from_array(he_weight(rng, 16, 16, 3, 3), "w1"),
             numpy_helper.from_array(he_weight(rng, 16, 16, 3, 3), "w2"),
             numpy_helper.from_array(he_weight(rng, 16, 1, 3, 3), "wd"),
             numpy_helper.from_array(he_weight(rng, 10, 16), "wf"),
             numpy_helper.from_array(rng.normal(0, 0.1, 10).astype(np.float32), "bf")]
    same = dict(pads=[1, 1, 1, 1])
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", **same),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("MaxPool", ["r0"], ["m0"], kernel_shape=[3, 3], strides=[2, 2],
                              name="pool0", **same),
             helper.make_node("Conv", ["m0", "w1"], ["c1"], name="conv1", **same),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", **same),
             helper.make_node("Add", ["c2", "m0"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["ra"]),
             helper.make_node("Conv", ["ra", "wd"], ["d"], strides=[2, 2], group=16,
                              name="dw", **same),
             helper.make_node("Relu", ["d"], ["rd"]),
             helper.make_node("GlobalAveragePool", ["rd"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1, name="fc")]
    graph = helper.make_graph(
        nodes, "spilled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, H, W])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _samples(count: int) -> "dict[str, np.ndarray]":
    return {"x": np.random.default_rng(1).random((count, 8, H, W)).astype(np.float32)}


def _quiet(message):
    pass


def _transfers(program) -> list:
    return [(Op.NAMES[i.op], program.layers[i.layer].name, i["count"], i["ext_addr"])
            for i in program.instructions if i.op in Op.ACTX]


def test_the_largest_tensor_moves_out_in_bands_of_rows():
    """700 words: the 8-channel input (2 words a pixel... of 8 lanes: 320 words) and the
    16-channel 20x16 conv0 output (640 words) do not fit together, so conv0's output lives in
    the external memory; conv0 writes it in two bands (its window and the input fit 700),
    the pool reads it back in two, each band's rows with the kernel's halo."""
    program = build(_model(), None, config=_config(700), calib=_samples(8),
                    log=_quiet).program
    names = [layer.name for layer in program.layers]
    assert names[:4] == ["conv0 [rows 0-10]", "conv0 [rows 11-19]", "pool0 [rows 0-7]",
                         "pool0 [rows 8-9]"]
    row = W * 2                              # words of one row of a 16-channel tensor
    assert _transfers(program) == [
        ("STOREA", "conv0 [rows 0-10]", 11 * row, 0),
        ("STOREA", "conv0 [rows 11-19]", 9 * row, 11 * row),
        # output rows 0-7 of a 3x3 stride-2 pool padded by 1 read input rows 0-15 ...
        ("LOADA", "pool0 [rows 0-7]", 16 * row, 0),
        # ... rows 8-9 read rows 15-19 (the bottom padding is outside the image)
        ("LOADA", "pool0 [rows 8-9]", 5 * row, 15 * row)]
    assert program.words["ext"] == H * row
    # the bands of a layer share its weights: the second band stores none
    words = {layer.name: layer.wgt_words for layer in program.layers}
    assert words["conv0 [rows 0-10]"] == 16 * 9 and words["conv0 [rows 11-19]"] == 0
    # every transfer runs alone: it is dispatched only when every engine is idle
    from hwonnx.compiler.timing import predict
    expanded = program.expanded()
    timing = predict(expanded, program.config)
    for index, instr in enumerate(expanded):
        if instr.op in Op.ACTX:
            assert all(done < timing.dispatch[index] for done in timing.done[:index])
            assert timing.dispatch[index + 1] > timing.done[index]


def test_spilled_tensors_run_bit_exact_in_the_predicted_cycles():
    """400 words: every tensor but the input's and the last ones lives in the external memory
    (the Add reads both of its inputs from there, the depthwise layer strides over one)."""
    result = build(_model(), None, config=_config(400), calib=_samples(8), log=_quiet)
    program = result.program
    transfers = _transfers(program)
    loaded = {layer for op, layer, _, _ in transfers if op == "LOADA"}
    stored = {layer for op, layer, _, _ in transfers if op == "STOREA"}
    assert {name.split(" [")[0] for name in loaded} >= {"pool0", "conv1", "conv2", "add", "dw"}
    assert {name.split(" [")[0] for name in stored} >= {"conv0", "pool0", "conv1", "add"}
    assert sum(1 for op, layer, _, _ in transfers if op == "LOADA" and "add" in layer) \
        == 2 * sum(1 for name in (layer.name for layer in program.layers) if "add" in name)
    assert program.words["act"] <= 400
    rtl_matches_golden(result, _samples(3), 3)


def test_a_window_that_does_not_fit_is_refused():
    """With every candidate outside, the pool's window of one band of output rows (3 input
    rows of 16 pixels of 2 words) does not fit 80 words: the error names the window."""
    with pytest.raises(ResourceError, match="Layer 'pool0': its window of 'r0:q' needs 96 "
                                            "activation words, but only 80"):
        build(_model(), None, config=_config(80), calib=_samples(4), log=_quiet)


def test_activations_in_the_external_memory_need_a_square_array():
    with pytest.raises(ResourceError, match="only with a square array"):
        build(_model(), None, config=_config(400, cols=16), calib=_samples(4), log=_quiet)


def _fully_convolutional() -> onnx.ModelProto:
    """x [1, 8, 20, 16] -> Conv 3x3 8->16 + Relu -> Conv 3x3 16->8: the output, as large as
    the input, is an image too."""
    rng = np.random.default_rng(6)
    inits = [numpy_helper.from_array(he_weight(rng, 16, 8, 3, 3), "w0"),
             numpy_helper.from_array(he_weight(rng, 8, 16, 3, 3), "w1")]
    same = dict(pads=[1, 1, 1, 1])
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", **same),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["y"], name="conv1", **same)]
    graph = helper.make_graph(
        nodes, "fcn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, H, W])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, H, W])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


#: 300 activation words, 512 weight words: the 320-word input lives in the external memory;
#: :func:`_model`'s convolutions' weights do not stream whole (two slots of 288 words and the
#: resident ones exceed 512), so they run in parts of 8 output channels; a band's part
#: streams a copy of the first band's weights, unless no other streamed layer runs in between.
SMALL = dict(act_depth=300, wgt_depth=512)


def test_inputs_outputs_and_weights_split_every_way_run_bit_exact():
    """The input in the external memory (the host writes it there), every convolution in
    bands of rows and parts of channels. conv0's part 8-15 is resident and its part 0-7
    streams once: its later bands read the same slot, loaded by one LOADX before the first
    (only resident layers run between them); conv1's bands alternate its two streamed parts,
    so the second band's parts stream copies of the first's. Bit-exact, in the predicted
    cycles."""
    result = build(_model(), None, config=_config(**SMALL), calib=_samples(8), log=_quiet)
    program = result.program
    x = program.placements["x:q"]
    assert (x.memory, x.words) == ("ext", 320)
    layers = {layer.name: layer for layer in program.layers}
    first, later = (layers[f"conv0 [rows {r}] [channels 0-7]"] for r in ("0-4", "15-19"))
    assert (first.ext_words, later.ext_words, later.wgt_words) == (72, 0, 0)
    assert layers["conv0 [rows 0-4] [channels 8-15]"].ext_words == 0        # resident
    index = {layer.name: i for i, layer in enumerate(program.layers)}
    conv0 = [i for i in program.instructions if i.op == Op.LOADX and i["count"] == 72]
    assert len(conv0) == 1 and conv0[0].layer == index[first.name] == 0     # at the start
    loads = {}                  # layer -> the weight words its LOADWs read
    for i in program.expanded():
        if i.op == Op.LOADW:
            loads.setdefault(i.layer, set()).add(i["wgt_addr"])
    slot = conv0[0]["wgt_addr"]
    assert loads[index[later.name]] == loads[index[first.name]]
    assert min(loads[index[first.name]]) == slot and max(loads[index[first.name]]) < slot + 72
    copy = layers["conv1 [rows 8-9] [channels 0-7]"]
    assert (copy.ext_words, copy.wgt_words) == (144, 0)
    rtl_matches_golden(result, _samples(2), 2)


def test_an_output_in_the_external_memory_is_read_back_bit_exact():
    """Input and output (320 words each) both live in the external memory: the harness writes
    the one and reads the other there."""
    result = build(_fully_convolutional(), None, config=_config(**SMALL), calib=_samples(8),
                   log=_quiet)
    program = result.program
    assert [program.placements[v].memory for v in ("x:q", "y:q")] == ["ext", "ext"]
    rtl_matches_golden(result, _samples(2), 2)


@pytest.mark.rtl
def test_the_board_link_writes_and_reads_ports_in_the_external_memory():
    """Through the board top and its UART with the memory model: the host writes the input,
    which lives in the external memory, with WRITEX and reads the output there with READX;
    bit-exact with golden in the predicted cycles."""
    from test_external_weights import board_top_cycles

    result = build(_fully_convolutional(), None, config=_config(**SMALL), calib=_samples(4),
                   log=_quiet)
    program = result.program
    assert [program.placements[v].memory for v in ("x:q", "y:q")] == ["ext", "ext"]
    board_top_cycles(result, _samples(2))


@pytest.mark.parametrize("prog_width", [0, 32], ids=["wide", "narrow-fetch"])
def test_per_layer_cycles_are_those_of_the_truncated_programs(prog_width):
    """The report's per-layer cycles come from one pass of the cycle model over the whole
    program; on a program with LOADX, LOADA and STOREA, bands and parts (and a narrow program
    memory), they equal those of the programs truncated after each layer, each predicted on
    its own."""
    from hwonnx.compiler.timing import predict
    from hwonnx.report import layer_cycles

    program = build(_model(), None, config=_config(**SMALL, prog_width=prog_width),
                    calib=_samples(4), log=_quiet).program
    ops = {instr.op for instr in program.instructions}
    assert {Op.LOADX, Op.LOADA, Op.STOREA} <= ops
    totals = [predict(program.truncated(i).expanded(), program.config).total
              for i in range(len(program.layers))]
    assert layer_cycles(program) == [t - ([0] + totals)[i] for i, t in enumerate(totals)]
    assert sum(layer_cycles(program)) == predict(program.expanded(), program.config).total


def _upsampling(kernel: int, pads: int, output_padding: int) -> onnx.ModelProto:
    """x [1, 8, 10, 8] -> Conv 3x3 8->16 + Relu -> ConvTranspose ``kernel`` stride 2 16->8 +
    Relu -> Conv 3x3 8->8: the transposed convolution's output and the graph's ([1, 8, 20,
    16], 320 words each) are the largest tensors."""
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array(he_weight(rng, 16, 8, 3, 3), "w0"),
             numpy_helper.from_array(he_weight(rng, 16, 8, kernel, kernel), "wt"),
             numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "bt"),
             numpy_helper.from_array(he_weight(rng, 8, 8, 3, 3), "w1")]
    same = dict(pads=[1, 1, 1, 1])
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", **same),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("ConvTranspose", ["r0", "wt", "bt"], ["t"], name="up",
                              kernel_shape=[kernel, kernel], strides=[2, 2],
                              pads=[pads] * 4, output_padding=[output_padding] * 2),
             helper.make_node("Relu", ["t"], ["rt"]),
             helper.make_node("Conv", ["rt", "w1"], ["y"], name="conv1", **same)]
    graph = helper.make_graph(
        nodes, "up", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 10, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, H, W])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("kernel, pads, output_padding", [(2, 0, 0), (3, 1, 1)],
                         ids=["2x2", "3x3-overlapping"])
def test_a_transposed_convolution_runs_in_bands_bit_exact(kernel, pads, output_padding):
    """A transposed convolution (U-Net's up-sampling) writing a tensor in the external memory
    runs in bands of output rows, each reading the input rows whose kernel rows reach it
    (with a 3x3 kernel at stride 2, neighbouring bands share an input row): bit-exact."""
    model = _upsampling(kernel, pads, output_padding)
    xs = {"x": np.random.default_rng(1).random((8, 8, 10, 8)).astype(np.float32)}
    result = build(model, None, config=_config(**SMALL), calib=xs, log=_quiet)
    program = result.program
    assert program.placements["y:q"].memory == "ext"
    bands = [layer.name for layer in program.layers if layer.name.startswith("up [rows")]
    assert len({name.split("]")[0] for name in bands}) > 1, bands
    firsts = {int(name.split()[2].split("-")[0]) for name in bands}
    assert len(firsts) > 1 and any(first % 2 for first in firsts), bands  # odd: phases swap
    assert any(op == "STOREA" and layer in bands for op, layer, *_ in _transfers(program))
    rtl_matches_golden(result, {"x": xs["x"][:2]}, 2)
