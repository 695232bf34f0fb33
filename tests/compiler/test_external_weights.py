"""Weights streamed from the external memory (hwonnx/compiler/stream.py, hdl/dma.py): a model
whose weights do not fit the weight buffer runs on the RTL with its largest layers' weights and
their parameters in the external memory model, bit-exact with golden in exactly the predicted
cycles."""

import re
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hwonnx.api import build
from hwonnx.cli import main
from hwonnx.compiler import Op
from hwonnx.compiler.timing import predict
from hwonnx.config import ArchConfig
from hwonnx.errors import ResourceError

from compiler_helpers import check_fences, streamed_model, streamed_samples
from rtl_helpers import he_weight, rtl_matches_golden

#: 8x8 array whose weight buffer is too small for the model's 1,824 weight words.
CONFIG = ArchConfig(act_depth=1024, wgt_depth=1280, acc_depth=256, par_depth=64,
                    prog_depth=256, ext_memory="ulx3s-sdram", ext_depth=4096)


def _quiet(message):
    pass


def test_streamed_layers_run_bit_exact_in_the_predicted_cycles():
    result = build(streamed_model(), None, config=CONFIG, calib=streamed_samples(8), log=_quiet)
    program = result.program
    words = {layer.name: layer.wgt_words for layer in program.layers}
    assert words == {"conv0": 576, "conv1": 512, "conv2": 512, "pool": 96, "fc": 128}
    # Largest first until the rest and two slots of the largest streamed layer fit 1280:
    # every layer but the pool (its ones) streams; conv0 and conv2 share slot 0, conv1 and
    # fc slot 1, after the pool's 96 resident words.
    assert len(program.images["wgt"]) == 96
    # and their parameters after the weights: 8 parameter words (64 channels) for each
    # convolution, 2 for fc's 10, each 9 external words; the pool's 8 stay in the buffer,
    # before two slots of 8
    params = [8 * 9, 8 * 9, 8 * 9, 2 * 9]
    assert len(program.images["ext"]) == 576 + 512 + 512 + 128 + sum(params)
    assert len(program.images["par"]) == 8 and program.words["par"] == 8 + 2 * 8
    assert program.words["wgt"] == 96 + 2 * 576
    loadx = [(i.layer, i["count"], i["wgt_addr"], i["ext_addr"], i.get("par_count", 0),
              i.get("par_addr", 0), i.get("par_ext", 0))
             for i in program.instructions if i.op == Op.LOADX]
    slots, par_slots, at = (96, 96 + 576), (8, 16), 1728
    assert loadx == [(0, 576, slots[0], 0, params[0], par_slots[0], at),   # at the start
                     (0, 512, slots[1], 576, params[1], par_slots[1], at + 72),
                     # conv2 into slot 0 once conv0 is done
                     (1, 512, slots[0], 1088, params[2], par_slots[0], at + 144),
                     # fc into slot 1 once conv1 is done
                     (2, 128, slots[1], 1600, params[3], par_slots[1], at + 216),
                     (3, 0, 0, 0, 0, 0, 0)]        # the fence before fc's LOADWs and POSTs
    check_fences(program)
    rtl_matches_golden(result, streamed_samples(3), 3)


@pytest.mark.parametrize("memory", ["ecpix5-ddr3", "arty-ddr3"])
def test_the_ddr3_memory_models_run_bit_exact_in_the_predicted_cycles(memory):
    """The ECPIX-5's and the Arty's DDR3 models (a word a cycle, other latencies and refresh
    periods than the SDRAM's) behind the same program: the RTL with each memory's model
    equals golden, in the cycles predicted with that memory's timing."""
    config = replace(CONFIG, ext_memory=memory)
    result = build(streamed_model(), None, config=config, calib=streamed_samples(8), log=_quiet)
    assert result.program.config.ext_timing.beats(config.cols) == 1
    rtl_matches_golden(result, streamed_samples(2), 2)


def test_the_cycle_model_takes_another_memory_timing():
    """``predict(..., memory_timing=T)`` runs the program with memory ``T`` behind the DMA
    engine (bench/bench_imagenet.py's memory-bound share): the memory's own timing gives the
    prediction, one that delivers a word every cycle with the shortest latency and no refresh
    fewer cycles, a slower one more."""
    program = build(streamed_model(), None, config=CONFIG, calib=streamed_samples(8),
                    log=_quiet).program
    config, expanded = program.config, program.expanded()
    own = predict(expanded, config).total
    assert predict(expanded, config, memory_timing=config.ext_timing).total == own
    fast = config.ext_timing.fastest(config.cols)
    assert (fast.latency, fast.bus_bytes, fast.size_bytes) == (2, config.cols,
                                                               config.ext_timing.size_bytes)
    slow = replace(config.ext_timing, latency=40, refresh_period=400)
    assert predict(expanded, config, memory_timing=fast).total < own
    assert predict(expanded, config, memory_timing=slow).total > own


def test_without_the_external_memory_the_weights_do_not_fit():
    on_chip = ArchConfig(**{**CONFIG.to_dict(), "ext_memory": "", "ext_depth": 0})
    with pytest.raises(ResourceError, match=r"needs 1824 words of the wgt buffer, but the 8x8 "
                                            r"architecture has 1280"):
        build(streamed_model(), None, config=on_chip, calib=streamed_samples(8), log=_quiet)


def test_a_layer_larger_than_half_the_buffer_is_refused_by_name():
    """128 words: the convolutions split into parts of one N tile (72 or 64 words), but the
    average pool's 96 words (a depthwise layer: not split) take two slots of 192."""
    small = ArchConfig(**{**CONFIG.to_dict(), "wgt_depth": 128})
    with pytest.raises(ResourceError, match=r"^Layer 'pool' has 96 weight words; streaming "
                                            r"it from the external memory takes two slots"):
        build(streamed_model(), None, config=small, calib=streamed_samples(8), log=_quiet)


def test_a_sized_build_doubles_a_weight_buffer_too_small_for_two_slots():
    """When the depths are sized to the model (a board or ``--board sim`` build without
    --wgt-depth), a weight buffer too small for two slots of a streamed layer doubles until
    they fit, and keeps that depth: the program streams, and with half of it the same
    lowering is refused."""
    from hwonnx.api import compile_model
    from hwonnx.compiler.lower import lower
    from hwonnx.compiler.sizing import probe
    from hwonnx.compiler.stream import SlotTooSmall

    small = ArchConfig(**{**CONFIG.to_dict(), "wgt_depth": 128})
    graph, program = compile_model(streamed_model(), streamed_samples(8), config=small, size="sim",
                                   log=_quiet)
    depth = program.config.wgt_depth
    assert depth in (256, 512, 1024) and any(layer.ext_words for layer in program.layers)
    with pytest.raises(SlotTooSmall):
        lower(graph, probe(ArchConfig(**{**small.to_dict(), "wgt_depth": depth // 2})))


def test_a_board_build_grows_the_weight_buffer_to_the_blocks_two_slots_need():
    """For a board, the weight buffer grows to the whole block RAMs (512 words on the ECP5)
    that two slots of the largest streamed part need, not to the next power of two: a 3x3
    convolution of 64 input channels has 9 x 8 x 8 = 576 weight words per group of 8 output
    channels, the least a part takes; two slots are 1,152 words, three blocks (doubling from
    128 words would give 2,048), fewer than the layer's 2,304."""
    from hwonnx.api import compile_model
    from hwonnx.compiler.lower import lower
    from hwonnx.compiler.stream import SlotTooSmall

    rng = np.random.default_rng(2)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv")], "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 6, 6])],
        [numpy_helper.from_array(he_weight(rng, 32, 64, 3, 3), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    samples = {"x": rng.random((4, 64, 6, 6)).astype(np.float32)}
    int_graph, program = compile_model(model, samples, config=replace(CONFIG, wgt_depth=128),
                                       size="ulx3s-85f", log=_quiet)
    assert program.config.wgt_depth == 3 * 512
    # every part streams, its one parameter word (9 external words) after its weights
    assert [layer.ext_words for layer in program.layers] == [576 + 9] * 4
    with pytest.raises(SlotTooSmall, match="576 weight words"):
        lower(int_graph, replace(program.config, wgt_depth=2 * 512))


def test_the_command_line_streams_and_simulates_bit_exact(tmp_path, capsys):
    """``hwonnx build --ext-memory``: the weight buffer keeps the depth given and the memory
    model is sized to the streamed words; ``hwonnx sim --compare`` runs the build folder on the
    RTL with the memory model and compares it with golden."""
    onnx.save(streamed_model(), tmp_path / "model.onnx")
    np.savez(tmp_path / "calib.npz", **streamed_samples(8))
    np.savez(tmp_path / "x.npz", **streamed_samples(2))
    out = tmp_path / "build"
    code = main(["build", str(tmp_path / "model.onnx"), "-o", str(out), "--calib",
                 str(tmp_path / "calib.npz"), "--ext-memory", "ulx3s-sdram", "--wgt-depth",
                 "1280", "--act-depth", "1024", "--acc-depth", "256"])
    assert code == 0, capsys.readouterr().err
    arch = ArchConfig.from_json((out / "arch.json").read_text())
    assert (arch.ext_memory, arch.wgt_depth, arch.ext_depth) == ("ulx3s-sdram", 1280, 2048)
    assert len((out / "ext.hex").read_text().split()) == 576 + 512 + 512 + 128 + 26 * 9
    report = (out / "report.md").read_text()
    assert "External memory `ulx3s-sdram`" in report
    capsys.readouterr()
    code = main(["sim", str(out), "--input", str(tmp_path / "x.npz"), "--compare"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    # 11,370 = 11,315 before #40.1 + 3 + 3 + 3 + 1 + 6 + 3 + 6 + 6 + 3 + 6 + 8 + 1 + 6 (see
    # test_the_board_design_loads_the_memory_...)
    assert "11,370 cycles per sample (predicted 11,370)" in captured.out
    assert "RTL equals the golden model bit for bit" in captured.out


def test_the_command_line_refuses_a_memory_the_board_does_not_have(tmp_path, capsys):
    onnx.save(streamed_model(), tmp_path / "model.onnx")
    code = main(["build", str(tmp_path / "model.onnx"), "-o", str(tmp_path / "out"),
                 "--board", "ecpix5-85", "--ext-memory", "ulx3s-sdram"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err == "hwonnx: error: Board 'ecpix5-85' has no external memory " \
                           "'ulx3s-sdram'; its memory is 'ecpix5-ddr3'\n"
    assert not (tmp_path / "out").exists()


def test_board_sources_carry_the_litedram_controller(tmp_path):
    """A ULX3S build with the SDRAM: the board sources hold LiteDRAM's core, instantiated on
    the SDRAM pins with its init sequencer; the bitstream of this build is in
    bench/results/boards.md."""
    out = tmp_path / "out"
    result = build(streamed_model(), out, board="ulx3s-85f", ext_memory="ulx3s-sdram",
                   wgt_depth=1280, calib=streamed_samples(8), log=_quiet)
    assert result.program.config.ext_depth == (32 << 20) // 8       # the whole SDRAM
    # weights and parameters (9 external words for each 8 channels)
    assert [layer.ext_words for layer in result.program.layers] == [576 + 72, 512 + 72,
                                                                    512 + 72, 0, 128 + 18]
    board = out / "board"
    assert "module hwonnx_dram (" in (board / "hwonnx_dram.v").read_text()
    script = (board / "hwonnx_top.ys").read_text()
    assert "hwonnx_dram.v" in script
    top = (board / "hwonnx_top.il").read_text()
    for needle in ("cell \\hwonnx_dram \\dram", "cell \\ODDRX1F \\sdram_clock",
                   "connect \\sdram_dq \\sdram_0__dq__io [15:0]", "connect \\wb_ctrl_stb "):
        assert needle in top, needle
    constraints = (board / "hwonnx_top.lpf").read_text()
    assert 'LOCATE COMP "sdram_0__clk__io" SITE "F19"' in constraints


def test_an_external_memory_holds_at_most_its_size():
    with pytest.raises(ValueError, match=r"at most the 4194304 words of 8 bytes that "
                                         r"'ulx3s-sdram' holds, not 4194305"):
        ArchConfig(ext_memory="ulx3s-sdram", ext_depth=(32 << 20) // 8 + 1)


@pytest.mark.rtl
def test_the_board_design_loads_the_memory_and_runs_over_the_uart():
    """The system top (accelerator, UART host bridge) with the memory model outside: the host
    loads the streamed weights with WRITEX, then runs samples; outputs equal golden and the
    board counts the predicted cycles."""
    result = build(streamed_model(), None, config=CONFIG, calib=streamed_samples(8), log=_quiet)
    # 11,318 cycles: 11,315 before the product register of #40.1 plus 3 x 1. The three conv
    # layers wait for their weights streamed from the SDRAM, which arrive after the previous
    # layer's POSTs are done: the longer drain is hidden there. At the three points that
    # wait for a layer's last POST (the pool layer's first MATMUL, with `wait`; the fc
    # layer's; END), that POST starts at `drained`, one cycle later (drain_cycles =
    # array_latency + 2, and array_latency is one more): +1 each. (By hand from the rules of
    # docs/architecture.md on the program's listing, e.g. the conv2 layer's last POST,
    # count 12, idle at drained + 1 + 5 + 12 (6 now, below), the pool layer's first MATMUL
    # starting then.)
    # 11,321: the requantization's rounding shift in a stage of its own (POST_LATENCY 4 -> 5)
    # makes each of those three last POSTs idle one cycle later: +3. 11,324: the accumulator
    # data registered (POST_LATENCY 6), +3 again. 11,325: the first instruction leaves in
    # cycle 2, not 1 (the instruction register fills from a read at start). 11,331: the
    # multiply in three stages (POST_LATENCY 8), +2 at each of the three points. 11,334: the
    # PE's operand registers (array_latency + 1, so drain_cycles + 1), +1 at each. 11,340: the
    # rounding shift in two stages (post_latency + 1) and the activation word registered
    # before the array (feed_delay 2, so drain_cycles + 1): +2 at each. 11,346: the multiply
    # in five stages (its operands and partial products registered again), +2 at each.
    # 11,349: the zero-point add apart from the clamp (clamp_stages 2), +1 at each. 11,355:
    # the weight buffer in banks and the activation word registered twice before the array
    # (feed_delay 3, so drain_cycles + 1) and the clamp's range flags in a stage of their own
    # (clamp_stages 3, post_latency + 1): +2 at each. 11,363: the dispatcher's hand-off
    # (every engine takes an instruction in the cycle after its dispatch, and counts busy
    # while it is in the hand-off register; a LOADW is handed over in the loader's last read
    # cycle, so back-to-back LOADWs keep their pace): six MATMULs that wait for the feeder's
    # slot start a cycle later (+6), END waits for the last POST, handed over a cycle later,
    # and for its one more cycle of drain (+2), a LOADX waits a cycle more for the DMA engine
    # (+1) and a LOADW that waited behind it a cycle less (-1). (Counted instruction by
    # instruction from compiler/timing.py's dispatch cycles with and without the hand-off.)
    # 11,364: the program memory read through the block RAM's output register (the first
    # instruction leaves in cycle 3, not 2). 11,370: the multiply's middle register
    # (array_latency + 1) and the accumulators' write register (the sum a cycle in a register
    # before the block RAM takes it): drain_cycles + 2, +2 at each of the three points.
    assert board_top_cycles(result) == [11370] * 2


def board_top_cycles(result, x: "dict | None" = None) -> "list[int]":
    """Run two samples of ``result`` (``x``, default: :func:`streamed_samples`) on its system
    top over the UART with the memory model; checks the outputs against golden and the board's
    cycle counts against the prediction, and returns those counts."""
    from hwonnx.api import simulate
    from hwonnx.boards.build import build_id
    from hwonnx.golden import quantize
    from hwonnx.sim.system import run_system

    program = result.program
    x = streamed_samples(2) if x is None else x
    quantizer = next(n for n in result.graph.nodes if n.op == "Quantize")
    q_in = {program.input_value: quantize(x["x"], **dict(quantizer.attrs))}
    outputs, cycles = run_system(program, q_in, divisor=4, build_id=build_id(program),
                                 log=_quiet)
    golden = simulate(result, x, mode="golden")
    np.testing.assert_array_equal(outputs[program.output_value].reshape(
        golden.int_outputs.shape), golden.int_outputs)
    assert cycles == [golden.predicted_cycles] * 2
    return cycles


def test_ecpix5_board_sources_carry_the_ddr3_controller_across_clocks(tmp_path):
    """An ECPIX-5 build with its DDR3: LiteDRAM's ECP5 DDR3 core on the board's pins (no chip
    select or reset: the board ties them), fed by the 100 MHz oscillator beside the
    accelerator's PLL, its sequencer (init and read leveling) and the crossing in the
    controller's clock; the bitstream of this build is in bench/results/boards.md."""
    out = tmp_path / "out"
    result = build(streamed_model(), out, board="ecpix5-85", ext_memory="ecpix5-ddr3",
                   wgt_depth=1280, calib=streamed_samples(8), log=_quiet)
    assert result.program.config.ext_depth == (512 << 20) // 8      # the whole DDR3
    # weights and parameters (9 external words for each 8 channels)
    assert [layer.ext_words for layer in result.program.layers] == [576 + 72, 512 + 72,
                                                                    512 + 72, 0, 128 + 18]
    board = out / "board"
    assert "module hwonnx_dram (" in (board / "hwonnx_dram.v").read_text()
    top = (board / "hwonnx_top.il").read_text()
    for needle in ("cell \\hwonnx_dram \\dram", "connect \\ddram_dq \\ddr3_0__dq__io [15:0]",
                   "connect \\ddram_dqs_p \\ddr3_0__dqs__p [1:0]", "connect \\wb_ctrl_dat_r ",
                   "cell \\EHXPLLL \\pll"):
        assert needle in top, needle
    # The controller's PLL and the accelerator's take the same oscillator.
    clkin = re.search(r"cell \\EHXPLLL \\pll\n(?:    .*\n)*?    connect \\CLKI (\S+)", top)
    dram_clk = re.search(r"cell \\hwonnx_dram \\dram\n(?:    .*\n)*?    connect \\clk (\S+)", top)
    assert clkin.group(1) == dram_clk.group(1)
    assert "cs_n" not in top and "reset_n" not in top
    constraints = (board / "hwonnx_top.lpf").read_text()
    for pin, site in (("ddr3_0__clk__p", "H3"), ("ddr3_0__dq__io[0]", "T4"),
                      ("ddr3_0__dqs__p[1]", "V1"), ("ddr3_0__a__io[14]", "H1")):
        assert f'LOCATE COMP "{pin}" SITE "{site}"' in constraints


def test_arty_board_sources_carry_the_ddr3_controller_for_vivado(tmp_path):
    """An Arty A7-35 build with its DDR3 (the 8x6 array: 48-bit words on the controller's
    64-bit port): sources for Vivado, which builds the Artix-7 PHY; both pads of the
    differential pairs, chip select and reset on the board's pins, the bank's reference
    voltage set."""
    out = tmp_path / "out"
    result = build(streamed_model(), out, board="arty-a7-35", ext_memory="arty-ddr3",
                   wgt_depth=2560, calib=streamed_samples(8), log=_quiet)
    assert result.program.config.ext_depth == (256 << 20) // 8      # 6-byte words, 8 each
    assert any(layer.ext_words for layer in result.program.layers)
    board = out / "board"
    top = (board / "hwonnx_top.v").read_text()
    for needle in (".ddram_clk_n(ddr3_0__clk__n)", ".ddram_dqs_n(ddr3_0__dqs__n)",
                   ".ddram_reset_n(ddr3_0__rst__io)", ".ddram_cs_n(ddr3_0__cs__io)"):
        assert needle in top, needle
    assert "INTERNAL_VREF 0.675 [get_iobanks 34]" in (board / "hwonnx_dram.xdc").read_text()
    assert 'read_xdc "hwonnx_dram.xdc"' in (board / "hwonnx_top.tcl").read_text()
    constraints = (board / "hwonnx_top.xdc").read_text()
    for pin, site in (("ddr3_0__clk__p", "U9"), ("ddr3_0__clk__n", "V9"),
                      ("ddr3_0__dq__io\\[0]", "K5")):
        assert f'set_property LOC {site} [get_ports "{pin}"]' in constraints, pin
