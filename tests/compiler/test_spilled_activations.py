"""Activations in the external memory (hwonnx/compiler/spill.py, LOADA/STOREA in hdl/dma.py):
a model whose tensors do not fit the activation buffer keeps the largest ones in the external
memory model; the layers that read or write them run in bands of rows through windows, on the
RTL bit-exact with golden in exactly the predicted cycles."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from hwonnx.api import build
from hwonnx.compiler import Op
from hwonnx.compiler.paging import truncated
from hwonnx.errors import ResourceError

from compiler_helpers import (SPILLED_H as H, SPILLED_W as W, check_fences, onnx_model,
                              spilled_config, spilled_model, spilled_samples)
from rtl_helpers import he_weight, rtl_matches_golden


def _quiet(message):
    pass


def _transfers(program) -> list:
    return [(Op.NAMES[i.op], program.layers[i.layer].name, i["count"], i["ext_addr"])
            for i in program.instructions if i.op in Op.ACTX]


def test_the_largest_tensor_moves_out_in_bands_of_rows():
    """700 words: the 8-channel input (2 words a pixel... of 8 lanes: 320 words) and the
    16-channel 20x16 conv0 output (640 words) do not fit together, so conv0's output lives in
    the external memory. Staging buffers of 704 words take two windows of 352 (11 rows of 32
    words) from addresses 700 (in) and 1404 (out), slot 1 at each one's end: conv0 writes its
    output in two bands, the pool reads it back in two, each band's rows with the kernel's
    halo, the next band's while the one before computes."""
    program = build(spilled_model(), None, config=spilled_config(700, stage=704),
                    calib=spilled_samples(8), log=_quiet).program
    names = [layer.name for layer in program.layers]
    assert names[:4] == ["conv0 [rows 0-10]", "conv0 [rows 11-19]", "pool0 [rows 0-4]",
                         "pool0 [rows 5-9]"]
    row = W * 2                              # words of one row of a 16-channel tensor
    transfers = [(Op.NAMES[i.op], names[i.layer], i["fence"], i["count"], i["act_addr"],
                  i["ext_addr"]) for i in program.instructions if i.op in Op.ACTX]
    assert transfers == [
        # a fence of no words before a layer's first band: every transfer before it done
        ("LOADA", "conv0 [rows 0-10]", 1, 0, 700, 0),
        # each band's STOREA after it, a fence (the one before it is done)
        ("STOREA", "conv0 [rows 0-10]", 1, 11 * row, 1404, 0),
        ("STOREA", "conv0 [rows 11-19]", 1, 9 * row, 1404 + 704 - 11 * row, 11 * row),
        # output rows 0-4 of a 3x3 stride-2 pool padded by 1 read input rows 0-9, rows 5-9
        # read rows 9-19 (the bottom padding is outside the image): both before band 0, the
        # second a fence, so band 0 starts once the first is in ...
        ("LOADA", "pool0 [rows 0-4]", 0, 10 * row, 700, 0),
        ("LOADA", "pool0 [rows 0-4]", 1, 11 * row, 700 + 704 - 11 * row, 9 * row),
        # ... and band 1 once the second is: a fence of no words
        ("LOADA", "pool0 [rows 5-9]", 1, 0, 700, 0)]
    assert program.words["ext"] == H * row
    assert (program.words["stage_in"], program.words["stage_out"]) == (704, 704)
    # the bands of a layer share its weights: the second band stores none
    words = {layer.name: layer.wgt_words for layer in program.layers}
    assert words["conv0 [rows 0-10]"] == 16 * 9 and words["conv0 [rows 11-19]"] == 0
    # the transfers run beside the computation: conv0's first STOREA while its second band
    # computes, the pool's second LOADA while its first band does
    from hwonnx.compiler.timing import predict
    expanded = program.expanded()
    timing = predict(expanded, program.config)
    moves = [k for k, i in enumerate(expanded) if i.op in Op.ACTX and i["count"]]
    for move, band in ((moves[0], 1), (moves[3], 2)):
        matmuls = [timing.dispatch[k] for k, i in enumerate(expanded)
                   if i.op == Op.MATMUL and i.layer == band]
        assert timing.dispatch[move] < matmuls[0] < timing.done[move], names[band]
    # and a band's MATMULs start only once its LOADAs are in
    loaded = {1: timing.done[moves[2]], 2: timing.done[moves[3]]}
    for k, i in enumerate(expanded):
        if i.op == Op.MATMUL and i.layer in (2, 3):
            assert timing.dispatch[k] > loaded[i.layer - 1]


def test_staging_buffers_are_sized_to_the_bands_of_one_row():
    """Without staging buffers a fixed architecture is refused, naming the layer and the words
    a band of one row needs of each (conv0's first: no input, one output row of 16 pixels of
    2 words); sized for a simulation, they take the larger of what the layers need and a
    quarter of the activation buffer, in a power of two (400 / 4 -> 128), and a layer whose
    windows fit them once but not twice runs single-buffered (the pool's band of one row
    reads 3 input rows: 96 words): its LOADAs, then a fence, before each band, its STOREA
    after it. Bit-exact in the predicted cycles."""
    with pytest.raises(ResourceError, match=r"Layer 'conv0' moves its rows through the staging "
                                            r"buffers in bands of one row: they need 0 and 32 "
                                            r"words \(stage_in_depth, stage_out_depth\), the "
                                            r"architecture has 0 and 0"):
        build(spilled_model(), None, config=spilled_config(400, stage=0), calib=spilled_samples(4),
              log=_quiet)
    result = build(spilled_model(), None, board="sim", ext_memory="ulx3s-sdram", act_depth=400,
                   calib=spilled_samples(8), log=_quiet)
    program = result.program
    config = program.config
    assert (config.act_depth, config.stage_in_depth, config.stage_out_depth) == (400, 128, 128)
    names = [layer.name for layer in program.layers]
    pool = [(i.op, i["count"], i["act_addr"], i["fence"]) for i in program.instructions
            if i.op in Op.ACTX and names[i.layer] == "pool0 [rows 1-1]"]
    # (its output row, 8 pixels of 2 words, lives outside too: its STOREA at 400 + 128)
    assert pool == [(Op.LOADA, 3 * 2 * W, 400, 0), (Op.LOADA, 0, 400, 1),
                    (Op.STOREA, 2 * 8, 528, 1)]
    rtl_matches_golden(result, spilled_samples(2), 2)


def test_a_board_build_grows_the_staging_buffers():
    """For a board, the staging buffers grow in whole block RAMs (512 words on the ECP5)
    until no band would grow (twice conv0's 640-word output, and the pool's input: 1,536
    each) or the design would fill more than 75% of the device's block RAM, whichever comes
    first."""
    from dataclasses import replace

    from hwonnx.boards import check_fits, get_board
    from hwonnx.fitting import STAGE_SHARE, _grown_stage

    result = build(spilled_model(), None, board="ulx3s-85f", ext_memory="ulx3s-sdram",
                   act_depth=400, calib=spilled_samples(4), log=_quiet, verilog=False)
    program = result.program
    config = program.config
    assert (config.act_depth, config.stage_in_depth, config.stage_out_depth) == (400, 1536, 1536)
    names = [layer.name for layer in program.layers]
    assert {"conv0 [rows 0-19]", "pool0 [rows 0-9]"} <= set(names)     # one band each
    board = get_board("ulx3s-85f")
    full = replace(config, wgt_depth=16384, stage_in_depth=512, stage_out_depth=512)
    grown = _grown_stage(full, board, (1 << 20, 1 << 20), ())       # 64 weight blocks
    assert 512 < grown.stage_out_depth <= grown.stage_in_depth <= grown.stage_out_depth + 512
    check_fits(grown, board, margin=STAGE_SHARE)
    with pytest.raises(ResourceError, match="block RAMs"):       # the shallower one's block
        check_fits(replace(grown, stage_out_depth=grown.stage_out_depth + 512), board,
                   margin=STAGE_SHARE)
    # the shallower first, to the same words in all; a fixed one stays
    total = grown.stage_in_depth + grown.stage_out_depth
    deep = _grown_stage(replace(full, stage_in_depth=2048), board, (1 << 20, 1 << 20), ())
    assert deep.stage_in_depth + deep.stage_out_depth == total
    assert abs(deep.stage_in_depth - deep.stage_out_depth) <= 512
    kept = _grown_stage(full, board, (1 << 20, 1 << 20), ("stage_out",))
    assert (kept.stage_in_depth, kept.stage_out_depth) == (total - 512, 512)


def test_a_board_build_keeps_the_staging_it_was_sized_with_when_grown_ones_need_more(
        monkeypatch):
    """Taller bands of grown staging buffers could need more of a buffer sized before they
    grew (a global pool in groups of channels needed fewer parameter words than whole, until
    groups stopped sharing them): the build then lowers with the staging buffers it was
    sized with instead of failing on a buffer the user never set."""
    from dataclasses import replace

    import hwonnx.fitting as fitting

    grown = []

    def too_small(config, board, limits, fixed):      # grown, but with 1 parameter word
        grown.append(replace(config, stage_in_depth=2048, par_depth=1))
        return grown[-1]

    monkeypatch.setattr(fitting, "_grown_stage", too_small)
    result = build(spilled_model(), None, board="ulx3s-85f", ext_memory="ulx3s-sdram",
                   act_depth=400, calib=spilled_samples(4), log=_quiet, verilog=False)
    config = result.program.config
    assert len(grown) == 1 and config.par_depth > 1 and config.stage_in_depth < 2048
    assert config == replace(grown[0], par_depth=config.par_depth,
                             stage_in_depth=config.stage_in_depth,
                             stage_out_depth=config.stage_out_depth)


@pytest.mark.parametrize("memory", ["ulx3s-sdram", "ecpix5-ddr3"])
def test_spilled_tensors_run_bit_exact_in_the_predicted_cycles(memory):
    """400 words: every tensor but the input's and the last ones lives in the external memory
    (the Add reads both of its inputs from there, the depthwise layer strides over one). On
    the SDRAM (4 cycles a word) the transfers set the pace; on the DDR3 (a word a cycle) the
    computation does, and a transfer waits for the engines before it to be done with its
    staging slot."""
    result = build(spilled_model(), None, config=spilled_config(400, ext_memory=memory),
                   calib=spilled_samples(8), log=_quiet)
    program = result.program
    transfers = _transfers(program)
    loaded = {layer for op, layer, _, _ in transfers if op == "LOADA"}
    stored = {layer for op, layer, _, _ in transfers if op == "STOREA"}
    assert {name.split(" [")[0] for name in loaded} >= {"pool0", "conv1", "conv2", "add", "dw"}
    assert {name.split(" [")[0] for name in stored} >= {"conv0", "pool0", "conv1", "add"}
    assert sum(1 for op, layer, _, _ in transfers if op == "LOADA" and "add" in layer) \
        == 2 * sum(1 for name in (layer.name for layer in program.layers) if "add" in name)
    assert program.words["act"] <= 400
    rtl_matches_golden(result, spilled_samples(3), 3)


def _through_the_memory() -> onnx.ModelProto:
    """x [1, 8, 10, 8] -> Conv 3x3 8->16 + Relu -> Conv 3x3 stride 2 16->16 + Relu -> global
    average pool -> Gemm 16->4: with 120 activation words, only the first convolution's
    output (160 words) lives in the external memory."""
    rng = np.random.default_rng(8)
    inits = [numpy_helper.from_array(he_weight(rng, 16, 8, 3, 3), "w0"),
             numpy_helper.from_array(he_weight(rng, 16, 16, 3, 3), "w1"),
             numpy_helper.from_array(he_weight(rng, 4, 16), "wf")]
    same = dict(pads=[1, 1, 1, 1])
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", **same),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], name="conv1", strides=[2, 2],
                              **same),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("GlobalAveragePool", ["r1"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "wf"], ["y"], transB=1, name="fc")]
    return onnx_model(nodes, "through", [1, 8, 10, 8], [1, 4], inits)


def test_transfers_wait_for_the_engines_that_use_their_slots():
    """On the DDR3 (a word a cycle) the computation sets the pace: conv0 writes its output in
    bands of one row (16 words) that STOREA copies out, each once the band's POSTs are done;
    conv1 reads them back in bands of one output row (3 input rows, 48 words), each LOADA two
    bands ahead once the MATMULs of the band before, which read its slot, are drained. Both
    waits hold some transfer up (the cycle model says by how much), and the RTL is bit-exact
    in the predicted cycles."""
    from hwonnx.compiler.timing import predict

    xs = np.random.default_rng(2).random((4, 8, 10, 8)).astype(np.float32)
    result = build(_through_the_memory(), None,
                   config=spilled_config(120, stage=96, ext_memory="ecpix5-ddr3"),
                   calib={"x": xs}, log=_quiet)
    program = result.program
    names = [layer.name for layer in program.layers]
    assert sum(name.startswith("conv0 [rows") for name in names) == 4
    assert sum(name.startswith("conv1 [rows") for name in names) == 5
    expanded = program.expanded()
    timing = predict(expanded, program.config)
    held = {Op.LOADA: 0, Op.STOREA: 0}       # transfers dispatched later than their turn
    for k, instr in enumerate(expanded):
        if instr.op in Op.ACTX and instr["count"]:
            held[instr.op] += timing.dispatch[k] > timing.dispatch[k - 1] + 1
    assert held[Op.LOADA] >= 3 and held[Op.STOREA] >= 3, held
    rtl_matches_golden(result, {"x": xs[:2]}, 2)


def test_a_window_that_does_not_fit_is_refused():
    """Staging buffers of 64 words hold conv0's output rows one at a time (32 words, twice),
    but not the pool's window of one band of output rows (3 input rows of 32 words, even
    once): the error names the layer."""
    with pytest.raises(ResourceError, match="Layer 'pool0' moves its rows through the staging "
                                            "buffers in bands of one row: they need 96 "):
        build(spilled_model(), None, config=spilled_config(400, stage=64),
              calib=spilled_samples(4), log=_quiet)


def test_activations_in_the_external_memory_need_a_square_array():
    with pytest.raises(ResourceError, match="only with a square array"):
        build(spilled_model(), None, config=spilled_config(400, cols=16),
              calib=spilled_samples(4), log=_quiet)


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
    return onnx_model(nodes, "fcn", [1, 8, H, W], [1, 8, H, W], inits)


#: 300 activation words, 512 weight words, staging buffers of 192: the 320-word input lives
#: in the external memory; :func:`spilled_model`'s convolutions' weights do not stream whole
#: (two slots of 288 words and the resident ones exceed 512), so they run in parts of 8 output
#: channels; a band's part streams a copy of the first band's weights, unless no other
#: streamed layer runs in between.
SMALL = dict(act_depth=300, wgt_depth=512, stage=192)


def test_inputs_outputs_and_weights_split_every_way_run_bit_exact():
    """The input in the external memory (the host writes it there), every convolution in
    bands of rows and parts of channels. conv0's part 8-15 is resident and its part 0-7
    streams once: its later bands read the same slot, loaded by one LOADX before the first
    (only resident layers run between them); conv1's bands alternate its two streamed parts,
    so the second band's parts stream copies of the first's. Bit-exact, in the predicted
    cycles."""
    result = build(spilled_model(), None, config=spilled_config(**SMALL),
                   calib=spilled_samples(8), log=_quiet)
    program = result.program
    x = program.placements["x:q"]
    assert (x.memory, x.words) == ("ext", 320)
    layers = {layer.name: layer for layer in program.layers}
    first, later = (layers[f"conv0 [rows {r}] [channels 0-7]"] for r in ("0-2", "18-19"))
    # 72 weight words and one parameter word of 9 external words
    assert (first.ext_words, later.ext_words, later.wgt_words) == (72 + 9, 0, 0)
    assert layers["conv0 [rows 0-2] [channels 8-15]"].ext_words == 0        # resident
    index = {layer.name: i for i, layer in enumerate(program.layers)}
    conv0 = [i for i in program.instructions if i.op == Op.LOADX and i["count"] == 72]
    assert len(conv0) == 1 and conv0[0].layer == index[first.name] == 0     # at the start
    loads = {}                  # layer -> the weight words its LOADWs read
    params = {}                 # ... and the parameter words its POSTs read
    for i in program.expanded():
        if i.op == Op.LOADW:
            loads.setdefault(i.layer, set()).add(i["wgt_addr"])
        elif i.op == Op.POST:
            params.setdefault(i.layer, set()).add(i["par_addr"])
    slot = conv0[0]["wgt_addr"]
    assert loads[index[later.name]] == loads[index[first.name]]
    assert params[index[later.name]] == params[index[first.name]] == {conv0[0]["par_addr"]}
    assert min(loads[index[first.name]]) == slot and max(loads[index[first.name]]) < slot + 72
    copy = layers["conv1 [rows 5-9] [channels 0-7]"]
    assert (copy.ext_words, copy.wgt_words) == (144 + 9, 0)
    check_fences(program)      # each band's LOADWs and POSTs after the fence of its copy
    rtl_matches_golden(result, spilled_samples(2), 2)


def test_an_output_in_the_external_memory_is_read_back_bit_exact():
    """Input and output (320 words each) both live in the external memory: the harness writes
    the one and reads the other there."""
    result = build(_fully_convolutional(), None, config=spilled_config(**SMALL),
                   calib=spilled_samples(8), log=_quiet)
    program = result.program
    assert [program.placements[v].memory for v in ("x:q", "y:q")] == ["ext", "ext"]
    rtl_matches_golden(result, spilled_samples(2), 2)


@pytest.mark.rtl
def test_the_board_link_writes_and_reads_ports_in_the_external_memory():
    """Through the board top and its UART with the memory model: the host writes the input,
    which lives in the external memory, with WRITEX and reads the output there with READX;
    bit-exact with golden in the predicted cycles."""
    from tests.compiler.test_external_weights import board_top_cycles

    result = build(_fully_convolutional(), None, config=spilled_config(**SMALL),
                   calib=spilled_samples(4), log=_quiet)
    program = result.program
    assert [program.placements[v].memory for v in ("x:q", "y:q")] == ["ext", "ext"]
    board_top_cycles(result, spilled_samples(2))


@pytest.mark.parametrize("prog_width", [0, 32], ids=["wide", "narrow-fetch"])
def test_per_layer_cycles_are_those_of_the_truncated_programs(prog_width):
    """The report's per-layer cycles come from one pass of the cycle model over the whole
    program; on a program with LOADX, LOADA and STOREA, bands and parts (and a narrow program
    memory), they equal those of the programs truncated after each layer, each predicted on
    its own."""
    from hwonnx.compiler.timing import predict
    from hwonnx.report import layer_cycles

    program = build(spilled_model(), None, config=spilled_config(**SMALL, prog_width=prog_width),
                    calib=spilled_samples(4), log=_quiet).program
    ops = {instr.op for instr in program.instructions}
    assert {Op.LOADX, Op.LOADA, Op.STOREA} <= ops
    totals = [predict(truncated(program, i).expanded(), program.config).total
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
    return onnx_model(nodes, "up", [1, 8, 10, 8], [1, 8, H, W], inits)


@pytest.mark.parametrize("kernel, pads, output_padding", [(2, 0, 0), (3, 1, 1)],
                         ids=["2x2", "3x3-overlapping"])
def test_a_transposed_convolution_runs_in_bands_bit_exact(kernel, pads, output_padding):
    """A transposed convolution (U-Net's up-sampling) writing a tensor in the external memory
    runs in bands of output rows, each reading the input rows whose kernel rows reach it
    (with a 3x3 kernel at stride 2, neighbouring bands share an input row): bit-exact."""
    model = _upsampling(kernel, pads, output_padding)
    xs = {"x": np.random.default_rng(1).random((8, 8, 10, 8)).astype(np.float32)}
    # staging buffers of 160 words: bands of 5 rows of 16 words, so that some start odd
    result = build(model, None, config=spilled_config(**{**SMALL, "stage": 160}), calib=xs,
                   log=_quiet)
    program = result.program
    assert program.placements["y:q"].memory == "ext"
    bands = [layer.name for layer in program.layers if layer.name.startswith("up [rows")]
    assert len({name.split("]")[0] for name in bands}) > 1, bands
    firsts = {int(name.split()[2].split("-")[0]) for name in bands}
    assert len(firsts) > 1 and any(first % 2 for first in firsts), bands  # odd: phases swap
    assert any(op == "STOREA" and layer in bands for op, layer, *_ in _transfers(program))
    rtl_matches_golden(result, {"x": xs["x"][:2]}, 2)
    # bands of one row (48 words: the next layer's three input rows) have the phases of
    # their row only, those of even rows and of odd rows in turn; each reads the words of
    # its phases emitted once: as many weight and parameter words as the layer whole on chip
    rows = build(model, None, config=spilled_config(**{**SMALL, "stage": 48}), calib=xs,
                 log=_quiet)
    bands = [layer.name for layer in rows.program.layers if layer.name.startswith("up [rows")]
    assert {name.split("] [")[0] for name in bands} == {f"up [rows {r}-{r}"
                                                        for r in range(H)}
    whole = build(model, None, config=spilled_config(act_depth=4096), calib=xs, log=_quiet).program
    assert not any(instr.op in Op.ACTX for instr in whole.instructions)
    assert ((rows.program.words["wgt"], rows.program.words["par"])
            == (whole.words["wgt"], whole.words["par"]))
    rtl_matches_golden(rows, {"x": xs["x"][:2]}, 2)


def _global_pooled(pool: str) -> onnx.ModelProto:
    """x [1, 8, 20, 16] -> Conv 3x3 stride 2 8->28 + Relu -> ``pool`` (global) -> Gemm 28->10:
    the pool's input, 10x8 pixels of 4 channel blocks (320 words, the last block half
    used), is in the external memory."""
    rng = np.random.default_rng(8)
    inits = [numpy_helper.from_array(he_weight(rng, 28, 8, 3, 3), "w0"),
             numpy_helper.from_array(he_weight(rng, 10, 28), "wf"),
             numpy_helper.from_array(rng.normal(0, 0.1, 10).astype(np.float32), "bf")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node(pool, ["r0"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1, name="fc")]
    return onnx_model(nodes, "pooled", [1, 8, H, W], [1, 10], inits)


@pytest.mark.parametrize("pool", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("stage, slots", [(192, 2), (96, 1)])
def test_a_global_pool_runs_in_groups_of_channel_blocks(pool, stage, slots):
    """A global pool whose input (320 words) does not fit the input staging buffer runs in
    groups of its 4 channel blocks, one LOADA per pixel each: with 192 words, one block
    (80 words) twice over; with 96, one block once. Bit-exact, in the predicted cycles."""
    xs = spilled_samples(8)
    result = build(_global_pooled(pool), None, config=spilled_config(act_depth=300, stage=stage),
                   calib=xs, log=_quiet)
    program = result.program
    names = [layer.name for layer in program.layers if layer.name.startswith("gap")]
    assert names == [f"gap [channels {c}-{min(c + 7, 27)}]" for c in range(0, 28, 8)]
    loads = [t for t in _transfers(program) if t[0] == "LOADA" and t[1] in names and t[2]]
    assert len(loads) == 4 * 80 and {t[2] for t in loads} == {1}
    # in the external memory after x (320 words): pixel p's block b is word 320 + 4 p + b,
    # in the order of the groups, each read once, into slot k mod 2 of the staging buffer
    assert [t[3] for t in loads] == [320 + 4 * p + b for b in range(4) for p in range(80)]
    starts = [i["act_addr"] for i in program.instructions if i.op == Op.LOADA
              and program.layers[i.layer].name in names and i["count"]][::80]
    assert len(set(starts)) == slots, starts
    rtl_matches_golden(result, {"x": xs["x"][:2]}, 2)


def test_a_layer_in_parts_takes_one_band_where_it_fits_once():
    """With staging buffers of 256 words, conv1 and conv2 (in parts of 8 output channels,
    their inputs 160 words) fit one band of the whole layer once but not twice: single-
    buffered, each part streams its weights once, where two double-buffered bands (7 and 3
    rows) streamed them twice; as few weight words as with 320 words, where the whole layer
    fits twice. Bit-exact, in the predicted cycles."""
    xs = spilled_samples(8)
    result = build(spilled_model(), None, config=spilled_config(**{**SMALL, "stage": 256}),
                   calib=xs, log=_quiet)
    roomy = build(spilled_model(), None, config=spilled_config(**{**SMALL, "stage": 320}),
                  calib=xs, log=_quiet).program
    program = result.program
    for name in ("conv1", "conv2"):
        assert [layer.name for layer in program.layers if layer.name.startswith(name)] == [
            f"{name} [rows 0-9] [channels {c}-{c + 7}]" for c in (0, 8)]
    streamed = [sum(i["count"] for i in p.instructions if i.op == Op.LOADX)
                for p in (program, roomy)]
    assert streamed[0] == streamed[1] == 648, streamed
    rtl_matches_golden(result, {"x": xs["x"][:2]}, 2)


def test_a_global_pool_too_large_for_one_channel_block_is_refused():
    """With 64 staging words, conv0's bands fit but not one channel block of the pool's 80
    input pixels: the error names the layer and the words it needs."""
    with pytest.raises(ResourceError, match=r"Layer 'gap' pools its input through the input "
                                            r"staging buffer one channel block at a time: it "
                                            r"needs 80 words \(stage_in_depth\), the "
                                            r"architecture has 64"):
        build(_global_pooled("GlobalAveragePool"), None,
              config=spilled_config(act_depth=300, stage=64), calib=spilled_samples(4),
              log=_quiet)
