"""Buffers sized to the model (hwonnx/compiler/sizing.py): the MLPerf Tiny models fit the
85F-class boards they did not fit with fixed depths, a simulation keeps the default depths
where they suffice, a depth given by hand is kept, and a model that cannot fit says which
buffer is short and by how much."""

import numpy as np
import pytest

from hwonnx.api import build
from hwonnx.boards import estimate, get_board
from hwonnx.compiler import Op
from hwonnx.compiler.sizing import needs, probe, sized
from hwonnx.config import ArchConfig
from hwonnx.errors import ResourceError
from hwonnx.examples import example_path, load_digits_data
from hwonnx.zoo import MLPERF_TINY, random_inputs

from rtl_helpers import looped_ops
from helpers import quiet

BOARDS = ["ulx3s-85f", "ecpix5-85", "arty-a7-100", "de10-nano"]


@pytest.fixture(scope="module")
def models():
    out = {}
    for name, make in MLPERF_TINY.items():
        model = make()
        out[name] = (model, random_inputs(model, 4))
    return out


@pytest.mark.parametrize("board", BOARDS)
def test_mlperf_tiny_fits_85f_class_boards(models, board):
    target = get_board(board)
    capacity = target.bram_kbits * 1024 // target.family_info.block_bits
    for name, (model, calib) in models.items():
        result = build(model, None, board=board, calib=calib, log=quiet)
        program, config = result.program, result.program.config
        # every array layer looped: three instructions per layer (the residual sums on the
        # element-wise engine two per tile), and END
        assert [i["op"] for i in program.instructions] == looped_ops(program), name
        for buffer, used in program.words.items():
            depth = getattr(config, f"{buffer}_depth")
            assert used <= depth < used + 512, (name, buffer, used, depth)
        usage = estimate(config, target)
        assert usage.bram_blocks <= capacity and usage.dsp <= target.dsp
        resources = result.report["resources"]
        assert resources["bram_blocks"] == {"used": usage.bram_blocks, "device": capacity,
                                            "per_buffer": usage.memories}
        assert resources["dsp"]["device"] == target.dsp


def test_the_board_default_depths_alone_hold_only_kws(models):
    """What was reported: with the ULX3S-85F's fixed default depths (an ``ArchConfig`` given
    whole is used as it is) no MLPerf Tiny model built; sized, all four do (above). KWS now
    fits them unsized: its average pool's weights (ones) are stored four per lane byte, 384
    words instead of 1,536, which brings its weights to 3,648 of the 4,096 words."""
    config = get_board("ulx3s-85f").default_config
    for name, (model, calib) in models.items():
        if name == "kws_dscnn":
            result = build(model, None, board="ulx3s-85f", config=config, calib=calib,
                           verilog=False, log=quiet)
            assert result.program.config == config
            pool = next(layer for layer in result.program.layers if layer.op == "QAvgPool")
            assert (pool.wgt_bits, pool.wgt_words) == (2, 384)
            assert result.program.words["wgt"] == 3648
            continue
        with pytest.raises(ResourceError, match=r"^(The model needs|Input|Layer)"):
            build(model, None, board="ulx3s-85f", config=config, calib=calib, log=quiet)


def test_simulation_keeps_default_depths_that_suffice():
    data = load_digits_data()
    result = build(example_path("digits_mlp"), None, calib={"image": data["calib"]}, log=quiet)
    assert result.program.config == ArchConfig()


def test_simulation_grows_a_short_buffer_to_a_power_of_two(models):
    model, calib = models["ad_autoencoder"]
    result = build(model, None, calib=calib, log=quiet)
    config, words = result.program.config, result.program.words
    assert words["wgt"] > ArchConfig().wgt_depth
    assert config.wgt_depth == 1 << (words["wgt"] - 1).bit_length()
    assert config.act_depth == ArchConfig().act_depth        # enough already: kept


def test_a_depth_given_by_hand_is_kept(models):
    model, calib = models["kws_dscnn"]
    with pytest.raises(ResourceError, match=r"^The model needs \d+ words of the wgt buffer, but "
                                            r"the 8x8 architecture has 1024; raise --wgt-depth"):
        build(model, None, calib=calib, wgt_depth=1024, log=quiet)
    result = build(model, None, board="ulx3s-85f", calib=calib, act_depth=16384, log=quiet)
    assert result.program.config.act_depth == 16384


def test_a_board_too_small_names_the_buffers_and_the_shortfall(models):
    model, calib = models["ic_resnet8"]
    with pytest.raises(ResourceError) as caught:
        build(model, None, board="ulx3s-25f", calib=calib, log=quiet)
    message = str(caught.value)
    assert "\n" not in message
    assert "does not fit board 'ulx3s-25f'" in message
    assert "the model's buffers take" in message and "more than the device has" in message
    for buffer in ("prog", "wgt", "act"):
        assert f"{buffer} " in message and " words" in message
    # The ULX3S has an SDRAM the weights could stream from: the message says how.
    assert message.endswith("; --ext-memory ulx3s-sdram streams the weights beyond 2048 words "
                            "from the board's external memory")


def test_a_buffer_beyond_the_instruction_fields_is_refused_by_name(models):
    model, calib = models["ad_autoencoder"]
    with pytest.raises(ResourceError, match=r"^The model needs \d+ words of the wgt buffer, more "
                                            r"than the 65536 an instruction can address"):
        build(model, None, board="ulx3s-25f", calib=calib, log=quiet)


def test_sized_depths():
    config = ArchConfig()
    words = {"act": 9000, "wgt": 100, "par": 3, "prog": 40, "acc": 96, "lut": 1}
    assert sized(config, words) == ArchConfig(act_depth=16384)
    board = sized(config, words, block_depth=512)
    assert (board.act_depth, board.wgt_depth, board.par_depth, board.prog_depth,
            board.acc_depth, board.lut_tables) == (9216, 512, 512, 512, 128, 1)
    kept = sized(config, words, fixed={"act", "lut"}, block_depth=512)
    assert (kept.act_depth, kept.lut_tables) == (config.act_depth, config.lut_tables)
    assert probe(config, fixed={"wgt"}).wgt_depth == config.wgt_depth
    assert probe(config).wgt_depth == 1 << 16


def test_needs_reads_the_program():
    data = load_digits_data()
    result = build(example_path("digits_cnn"), None, calib={"image": data["calib"].reshape(
        -1, 1, 8, 8)}, log=quiet)
    program = result.program
    words = needs(program)
    assert {k: words[k] for k in program.words} == program.words
    posts = [i["count"] for i in program.expanded() if i["op"] == Op.POST]
    assert words["acc"] == 2 * max(posts)
    assert words["lut"] == len(program.images.get("lut", ())) // 256
    assert np.all(np.array(posts) > 0)


def _gray_conv(side: int):
    """A 3x3 Conv + Relu on a one-channel side x side image (a grayscale camera frame)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(0, 0.3, (4, 1, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
         helper.make_node("Relu", ["c"], ["y"], name="relu")], "gray",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, side, side])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, {"x": rng.random((2, 1, side, side)).astype(np.float32)}


def test_a_board_build_falls_back_to_an_array_that_fits():
    """One channel in eight lanes: the 8x8 array's activation words are mostly padding and
    the 160x160 image does not fit the ULX3S-85F's block RAM; with no array given the build
    takes the largest smaller array that fits, and says so. An array given is kept."""
    model, calib = _gray_conv(160)
    said = []
    result = build(model, None, board="ulx3s-85f", calib=calib, log=said.append)
    config = result.program.config
    assert (config.rows, config.cols) == (4, 4)
    assert "The 8x8 array and this model's buffers do not fit board 'ulx3s-85f'; using a 4x4 " \
           "array" in said
    with pytest.raises(ResourceError, match=r"^The 8x8 accelerator does not fit board "
                                            r"'ulx3s-85f': \d+ block RAMs"):
        build(model, None, board="ulx3s-85f", calib=calib, rows=8, cols=8, log=quiet)
