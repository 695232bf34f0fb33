"""``hwonnx demo``: build the bundled trained digit classifiers, run the test set on the RTL
and the golden model, and compare accuracy with onnxruntime on the float model."""

from pathlib import Path

import numpy as np

from .errors import MismatchError

__all__ = ["run_demo", "onnxruntime_outputs"]

_SHAPES = {"digits_mlp": (-1, 64), "digits_cnn": (-1, 1, 8, 8)}


def onnxruntime_outputs(model_path: Path, inputs: "dict[str, np.ndarray]") -> np.ndarray:
    """The float model's first output on ``inputs``, one sample at a time, by onnxruntime."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    name = next(iter(inputs))
    return np.concatenate([session.run(None, {name: x[None]})[0] for x in inputs[name]])


def run_demo(model: str, out: Path, *, rows=None, cols=None, samples: int = 0,
             log=print) -> int:
    from . import api
    from .examples import example_path, load_digits_data

    data = load_digits_data()
    names = list(_SHAPES) if model == "all" else [model]
    count = samples or len(data["test_labels"])
    labels = data["test_labels"][:count]
    rows_out = []
    for name in names:
        shape = _SHAPES[name]
        path = example_path(name)
        result = api.build(path, Path(out) / name, calib={"image": data["calib"].reshape(shape)},
                           rows=rows, cols=cols, log=log)
        inputs = {"image": data["test_images"][:count].reshape(shape)}
        log(f"Simulating {count} test images of {name} on the RTL ...")
        rtl = api.simulate(result, inputs, mode="rtl", log=log)
        golden = api.simulate(result, inputs, mode="golden")
        reference = onnxruntime_outputs(path, inputs)
        accuracy = {
            "float (onnxruntime)": (reference.argmax(-1) == labels).mean(),
            "int8 golden": (golden.outputs["logits"].argmax(-1) == labels).mean(),
            "int8 RTL": (rtl.outputs["logits"].argmax(-1) == labels).mean(),
        }
        exact = np.array_equal(rtl.int_outputs, golden.int_outputs)
        error = np.abs(golden.outputs["logits"] - reference)
        rows_out.append((name, accuracy, exact, rtl, error))
        if not exact:
            raise MismatchError(f"{name}: RTL differs from the golden model: "
                                + api.first_difference(result, inputs, int(np.argwhere(
                                    (rtl.int_outputs != golden.int_outputs).reshape(
                                        count, -1).any(axis=1))[0][0]), log=log))
    print(f"\nhwonnx demo: {count} test images of scikit-learn digits, "
          f"{result.program.config.rows}x{result.program.config.cols} array, Verilator RTL")
    print(f"{'model':12} {'float':>8} {'golden':>8} {'RTL':>8}  {'RTL=golden':10} "
          f"{'cycles':>8} {'predicted':>9} {'util':>6} {'max |golden-float|':>19}")
    for name, accuracy, exact, rtl, error in rows_out:
        acc = list(accuracy.values())
        print(f"{name:12} {acc[0]:8.2%} {acc[1]:8.2%} {acc[2]:8.2%}  "
              f"{'bit-exact' if exact else 'DIFFERS':10} {int(np.mean(rtl.cycles)):8,} "
              f"{rtl.predicted_cycles:9,} {rtl.utilization:6.1%} {error.max():19.4f}")
    return 0
