"""End to end on the bundled trained examples: float, golden and RTL accuracy on the whole
test set, with the RTL equal to the golden model bit for bit."""

import pytest

from hwonnx.demo import evaluate_example

pytestmark = pytest.mark.rtl


@pytest.mark.parametrize("name", ["digits_mlp", "digits_cnn"])
def test_example_on_rtl(tmp_path, name, capsys):
    run = evaluate_example(name, tmp_path, log=lambda message: None)
    with capsys.disabled():
        print(f"\n{name}: accuracy {run.accuracy}, top-1 agreement with float "
              f"{run.top1_agreement:.2%}, {run.cycles} cycles (predicted "
              f"{run.predicted_cycles}), utilization {run.utilization:.1%}")
    assert run.samples == 450
    assert run.bit_exact
    assert run.cycles == run.predicted_cycles
    assert run.accuracy["int8 RTL"] == run.accuracy["int8 golden"]
    assert run.accuracy["int8 RTL"] >= 0.95
    assert abs(run.accuracy["int8 golden"] - run.accuracy["float (onnxruntime)"]) <= 0.02
    assert run.top1_agreement >= 0.97
