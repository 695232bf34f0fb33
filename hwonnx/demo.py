"""``hwonnx demo``: build the bundled trained digit classifiers, run the test set on the RTL
and the golden model, and compare accuracy with onnxruntime on the float model."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import MismatchError, UsageError

__all__ = ["ExampleRun", "demo_runs", "evaluate_example", "format_demo", "onnxruntime_outputs",
           "run_demo"]

_SHAPES = {"digits_mlp": (-1, 64), "digits_cnn": (-1, 1, 8, 8)}


def onnxruntime_outputs(model_path: Path, inputs: "dict[str, np.ndarray]") -> np.ndarray:
    """The float model's first output on ``inputs``, one sample at a time, by onnxruntime."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    name = next(iter(inputs))
    return np.concatenate([session.run(None, {name: x[None]})[0] for x in inputs[name]])


@dataclass
class ExampleRun:
    name: str
    samples: int
    accuracy: "dict[str, float]"      # float (onnxruntime), int8 golden, int8 RTL
    top1_agreement: float             # golden vs float
    bit_exact: bool                   # RTL == golden on every output value
    cycles: int                       # simulated cycles per inference
    predicted_cycles: int
    utilization: float
    cycles_per_second: float
    array: str
    out_dir: "Path | None" = None     # the build folder


def evaluate_example(name: str, out: Path, *, rows=None, cols=None, samples: int = 0,
                     log=print) -> ExampleRun:
    """Build bundled example ``name``, run ``samples`` test images (0: all) on the RTL and the
    golden model, and measure accuracy against the labels and onnxruntime."""
    from . import api
    from .examples import example_path, load_digits_data

    if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 0:
        raise UsageError(f"The number of test samples (--samples) must be a whole number from "
                         f"0 (0: all), not {samples!r}")
    data = load_digits_data()
    count = samples or len(data["test_labels"])
    labels = data["test_labels"][:count]
    shape = _SHAPES[name]
    path = example_path(name)
    folder = Path(out) / name
    log(f"Building {name} into {folder}/ ...")
    result = api.build(path, folder, calib={"image": data["calib"].reshape(shape)},
                       rows=rows, cols=cols, log=log)
    inputs = {"image": data["test_images"][:count].reshape(shape)}
    log(f"Simulating {count} test images of {name} on the RTL ...")
    rtl = api.simulate(result, inputs, mode="rtl", log=log)
    golden = api.simulate(result, inputs, mode="golden")
    reference = onnxruntime_outputs(path, inputs)
    exact = bool(np.array_equal(rtl.int_outputs, golden.int_outputs))
    if not exact:
        differs = (rtl.int_outputs != golden.int_outputs).reshape(count, -1).any(axis=1)
        raise MismatchError(f"{name}: RTL differs from the golden model: " + api.first_difference(
            result, inputs, int(np.argwhere(differs)[0][0]), log=log))
    top1 = golden.outputs["logits"].argmax(-1)
    cfg = result.program.config
    return ExampleRun(
        name, count,
        {"float (onnxruntime)": float((reference.argmax(-1) == labels).mean()),
         "int8 golden": float((top1 == labels).mean()),
         "int8 RTL": float((rtl.outputs["logits"].argmax(-1) == labels).mean())},
        float((top1 == reference.argmax(-1)).mean()), exact, int(np.mean(rtl.cycles)),
        rtl.predicted_cycles, rtl.utilization, rtl.steady_cycles_per_second, cfg.name, folder)


def demo_runs(model: str, out: Path, *, rows=None, cols=None, samples: int = 0,
              log=print) -> "list[ExampleRun]":
    """:func:`evaluate_example` for ``model`` (``"all"``: every bundled example), each built
    into ``out/<name>/``."""
    names = list(_SHAPES) if model == "all" else [model]
    return [evaluate_example(name, out, rows=rows, cols=cols, samples=samples, log=log)
            for name in names]


def format_demo(runs: "list[ExampleRun]") -> str:
    """The results table ``hwonnx demo`` prints, and where the builds are."""
    lines = [f"\nhwonnx demo: {runs[0].samples} scikit-learn digits test images, "
             f"{runs[0].array} array, RTL on Verilator",
             f"{'model':11} {'float':>7} {'golden':>7} {'RTL':>7}  {'RTL vs golden':13} "
             f"{'cycles':>7} {'predicted':>9} {'util':>6} {'top-1 = float':>13}"]
    for run in runs:
        acc = list(run.accuracy.values())
        lines.append(f"{run.name:11} {acc[0]:7.2%} {acc[1]:7.2%} {acc[2]:7.2%}  "
                     f"{'bit-exact' if run.bit_exact else 'DIFFERS':13} {run.cycles:7,} "
                     f"{run.predicted_cycles:9,} {run.utilization:6.1%} "
                     f"{run.top1_agreement:13.2%}")
    lines.append("float: onnxruntime on the float model; golden: hwonnx's NumPy int8 model; "
                 "RTL: the Verilog simulated cycle by cycle.")
    folders = [f"{run.out_dir}/" for run in runs if run.out_dir is not None]
    if folders:
        lines.append(f"Builds (accel.v, program and memory images, report.md) in "
                     f"{', '.join(folders)}")
    return "\n".join(lines)


def run_demo(model: str, out: Path, *, rows=None, cols=None, samples: int = 0,
             log=print) -> int:
    """Run the demo and print its results (:func:`demo_runs`, :func:`format_demo`)."""
    print(format_demo(demo_runs(model, out, rows=rows, cols=cols, samples=samples, log=log)))
    return 0
