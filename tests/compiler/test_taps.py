"""Packed taps (hwonnx/compiler/taps.py, issue 15 "first layers with few input channels"): a
graph input of fewer channels than rows, read by one convolution, is written with each output
pixel's window in its lanes, and the layer is a 1x1 convolution over it. The lanes equal the
ONNX convolution's windows; the RTL equals golden in the predicted cycles, fewer than unpacked;
the packed form is kept only where the activation buffer grows by at most 1/8."""

import numpy as np
import pytest
from onnx import helper

from hwonnx.api import build, load_build
from hwonnx.compiler.layout import pack_words, _words_to_lanes
from hwonnx.compiler.lower import PACKED_GROWTH, _lower
from hwonnx.compiler.taps import packable_inputs
from hwonnx.compiler.timing import predict
from hwonnx.config import ArchConfig
from rtl_helpers import float_reference, he_weight, rtl_matches_golden
from spec_helpers import make_model

RNG = np.random.default_rng(41)
QUIET = lambda message: None                                           # noqa: E731


def first_conv_model(c, hw, kernel, strides, pads, dilations, pad_value=None, out=16):
    """x [1, c, *hw] -> (Pad(constant pad_value) ->) Conv -> Relu -> Conv 1x1 -> y."""
    nodes, x = [], "x"
    inits = {"w1": he_weight(RNG, out, c, *kernel), "w2": he_weight(RNG, 8, out, 1, 1)}
    if pad_value is not None:
        inits["pads"] = np.array([0, 0, 1, 2, 0, 0, 1, 2], np.int64)
        inits["value"] = np.array(pad_value, np.float32)
        nodes.append(helper.make_node("Pad", ["x", "pads", "value"], ["xp"], name="pad"))
        x = "xp"
    nodes += [helper.make_node("Conv", [x, "w1"], ["c1"], name="conv1", kernel_shape=kernel,
                               strides=strides, pads=pads, dilations=dilations),
              helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
              helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2")]
    return make_model(nodes, {"x": [1, c, *hw]}, {"y": [1, 8, None, None]}, inits, opset=13)


def _reference_windows(x, kernel, strides, pads, dilations, fill):
    """[OH*OW, C*KH*KW] windows of one sample ``x`` [C, H, W] straight from the ONNX Conv
    definition (input position oy*sy + ky*dy - pad_top, ...), ``fill`` outside."""
    c, h, w = x.shape
    (kh, kw), (sy, sx), (dy, dx) = kernel, strides, dilations
    oh = (h + pads[0] + pads[2] - dy * (kh - 1) - 1) // sy + 1
    ow = (w + pads[1] + pads[3] - dx * (kw - 1) - 1) // sx + 1
    out = np.full((oh * ow, c * kh * kw), fill, np.int64)
    for oy in range(oh):
        for ox in range(ow):
            for ci in range(c):
                for ky in range(kh):
                    for kx in range(kw):
                        y, xx = oy * sy + ky * dy - pads[0], ox * sx + kx * dx - pads[1]
                        if 0 <= y < h and 0 <= xx < w:
                            out[oy * ow + ox, (ci * kh + ky) * kw + kx] = x[ci, y, xx]
    return out


CASES = {   # c, hw, kernel, strides, pads, dilations
    "kws_like": (1, (13, 10), (5, 4), (2, 2), (2, 1, 2, 2), (1, 1)),
    "rgb_3x3": (3, (12, 11), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    "dilated": (2, (9, 12), (3, 2), (1, 2), (0, 2, 1, 0), (2, 3)),
}


def _build(model, calib):
    return build(model, None, calib={"x": calib}, config=ArchConfig(), verilog=False, log=QUIET)


@pytest.mark.parametrize("case", sorted(CASES))
def test_packed_lanes_are_the_convolutions_windows(case):
    c, hw, kernel, strides, pads, dilations = CASES[case]
    calib = RNG.normal(0, 1, (16, 1, c, *hw)).astype(np.float32)
    result = _build(first_conv_model(*CASES[case]), calib)
    placement = result.program.placements["x:q"]
    assert placement.packed and placement.cb == -(-c * kernel[0] * kernel[1] // 8)
    zp = next(n for n in result.graph.nodes if n.op == "Quantize").attrs["zero_point"]
    assert placement.fill == zp
    x = RNG.integers(-128, 128, (c, *hw)).astype(np.int8)
    words = pack_words(x[None], placement, 8)
    lanes = _words_to_lanes(words, 8).view(np.int8).astype(np.int64)
    lanes = lanes.reshape(placement.height * placement.width, -1)
    want = _reference_windows(x, kernel, strides, pads, dilations, zp)
    np.testing.assert_array_equal(lanes[:, :want.shape[1]], want)


@pytest.mark.rtl
@pytest.mark.parametrize("case", sorted(CASES) + ["folded_pad"])
def test_packed_first_layer_on_rtl(case, tmp_path):
    """RTL equal to golden (every layer), cycles as predicted, fewer than the unpacked
    program's; golden within 4 % of the output range of onnxruntime on the float model; the
    build folder keeps the packing (``hwonnx sim`` of the folder gives the same outputs). A
    folded constant Pad (value 0.7) fills the packed padding lanes with its int8 value."""
    if case == "folded_pad":
        args = (3, (12, 11), (3, 3), (3, 3), (0, 0, 0, 0), (1, 1))   # the Pad pads it
        model = first_conv_model(*args, pad_value=0.7)
    else:
        args = CASES[case]
        model = first_conv_model(*args)
    c, hw = args[:2]
    calib = RNG.normal(0, 1, (32, 1, c, *hw)).astype(np.float32)
    result = build(model, tmp_path / "out", calib={"x": calib}, config=ArchConfig(),
                   verilog=False, log=QUIET)
    placement = result.program.placements["x:q"]
    assert placement.packed
    conv = next(n for n in result.graph.nodes if n.op == "QConv")
    if case == "folded_pad":
        assert conv.attrs["pad_q"] is not None and placement.fill == conv.attrs["pad_q"] \
            != conv.attrs["in_zp"]
    x = calib[:3]
    rtl = rtl_matches_golden(result, {"x": x}, 3)
    config = result.program.config
    plain = _lower(result.graph, config, True, {})
    assert rtl.predicted_cycles < predict(plain.expanded(), config).total
    want = float_reference(model, x)
    error = np.abs(rtl.outputs["y"].reshape(want.shape) - want).max() / np.ptp(want)
    print(f"\n{case}: {rtl.predicted_cycles} cycles packed, "
          f"{predict(plain.expanded(), config).total} unpacked; golden vs float "
          f"{error:.2%} of the range")
    assert error < 0.04
    loaded = load_build(tmp_path / "out")
    assert loaded.program.placements["x:q"] == placement
    assert loaded.program.placements["x:q"].fill == placement.fill
    np.testing.assert_array_equal(
        rtl_matches_golden(loaded, {"x": x}, 3).int_outputs, rtl.int_outputs)


def test_packing_that_would_grow_the_activation_buffer_is_not_kept():
    """A 3x3 convolution with stride 1 over three channels makes each pixel four words on 8
    rows (27 lanes) against one: the activation high-water mark would grow far more than 1/8,
    so the input stays unpacked; with stride 2 the packed input is no larger and is kept."""
    for strides, packed in (((1, 1), False), ((2, 2), True)):
        model = first_conv_model(3, (16, 16), (3, 3), strides, (1, 1, 1, 1), (1, 1), out=4)
        result = _build(model, RNG.normal(0, 1, (16, 1, 3, 16, 16)).astype(np.float32))
        program, graph = result.program, result.graph
        assert program.placements["x:q"].packed is packed
        chosen = packable_inputs(graph, ["x:q"], 8)
        both = [_lower(graph, program.config, True, pick) for pick in ({}, chosen)]
        grows = both[1].words["act"] > both[0].words["act"] * (1 + PACKED_GROWTH)
        assert grows is not packed
