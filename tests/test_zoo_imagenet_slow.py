"""The slow tier of the external memory (issue 16): ImageNet-class models of
:mod:`hwonnx.zoo.imagenet` compiled for the ULX3S-85F with its SDRAM and run on the RTL with
the SDRAM's memory model: every tensor that does not fit the 4,096-word activation buffer
(the 224x224 or 256x256 input among them) lives in the SDRAM, every layer whose weights do
not fit streams them (in parts of output channels where a layer's are too many for a slot),
and one sample's outputs equal golden's bit for bit in exactly the predicted cycles.

The default suite runs the same mechanisms on small models (test_spilled_activations.py,
test_external_weights.py). Each model here takes minutes to compile and to simulate."""

import numpy as np
import pytest

from hwonnx.api import build, simulate
from hwonnx.zoo import mobilenet_v2, random_inputs, resnet18, yolo_tiny

pytestmark = pytest.mark.slow

#: Weight-buffer words for these models: two slots of ResNet-18's largest part (one N tile of
#: a 3x3 512-channel convolution: 9 x 64 x 8 = 4,608 words) and the resident layers.
WGT_DEPTH = 16384


def _quiet(message):
    pass


@pytest.mark.parametrize("builder", [yolo_tiny, mobilenet_v2, resnet18],
                         ids=["yolo_tiny", "mobilenet_v2", "resnet18"])
def test_imagenet_class_model_runs_bit_exact_with_the_sdram_model(builder):
    model = builder(0)
    result = build(model, None, board="ulx3s-85f", ext_memory="ulx3s-sdram",
                   calib=random_inputs(model, 4, 0), wgt_depth=WGT_DEPTH, log=_quiet)
    program = result.program
    assert program.config.act_depth == 4096
    assert program.placements["input:q"].memory == "ext"
    assert program.words["ext"] > program.config.act_depth + program.config.wgt_depth
    inputs = random_inputs(model, 1, 1)
    rtl = simulate(result, inputs, mode="compare", log=_quiet)
    golden = simulate(result, inputs, mode="golden")
    np.testing.assert_array_equal(rtl.int_outputs, golden.int_outputs)
    assert rtl.cycles == [rtl.predicted_cycles]
