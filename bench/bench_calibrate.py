"""Calibration methods on exporter corpus models: how far each method's int8 model is from the
float model.

``python bench/bench_calibrate.py CORPUS [--models a,b]``, where ``CORPUS`` is the corpus
folder of ``bench_corpus.py`` (``manifest.json``, ``models/``, ``refdata/NAME.npz`` with
``calib``: 32 samples, ``x``: 8 further ones, ``y_<output>``: onnxruntime's float outputs on
``x``). Per model and method (``--calibrate`` minmax, percentile, entropy, mse): the build's
steps to the integer graph as the architecture computes it (``read`` ... ``fit-architecture``,
calibrated on ``calib``), then the golden model (what the RTL computes bit for bit) on ``x``,
compared with ``y_<output>``: the RMS and the largest difference as shares of the reference's
range over the 8 samples (per output; the table shows the largest share over the outputs),
and, where an output is a score vector (``[1, N]``, N > 1), the top-1 agreement. The corpus's
weights are random: its README calls top-1 a weak measure there. Also the time the
quantization takes (calibration, the quantizer and its check on the float model), and what
``hwonnx inspect --calib`` prints and suggests for the model (each method's output error on
the calibration samples themselves, :func:`hwonnx.quant.compare.compare_methods`).
Writes ``bench/results/calibrate.json`` and ``.md``. The corpus is read only through the
argument: hwonnx never reads it.
"""

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from results_io import RESULTS, measured_commit, write_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hwonnx.config import ArchConfig  # noqa: E402
from hwonnx.golden import evaluate  # noqa: E402
from hwonnx.pipeline import BuildRequest, BuildState, run_steps  # noqa: E402
from hwonnx.quant import normalize_samples  # noqa: E402
from hwonnx.quant.calibrate import METHODS  # noqa: E402
from hwonnx.quant.compare import best_method, compare_methods  # noqa: E402
from hwonnx.quant.data import calibration_feeds  # noqa: E402

#: Float models of the corpus that build on the simulation target in minutes (the Brevitas
#: models are pre-quantized: no calibration).
MODELS = ["keras_cnn_32", "keras_sepconv_32", "kws_1d", "se_cnn", "two_io", "tiny_yolo",
          "mobilenet_v2_96"]


def samples(refdata, inputs: "list[str]", kind: str) -> "dict[str, np.ndarray]":
    """The ``kind`` (``calib``, ``x``) samples of every input, keyed by input name."""
    return {name: refdata[f"{kind}_{name}" if len(inputs) > 1 else kind] for name in inputs}


def measure(model: Path, refdata, inputs: "list[str]", outputs: "list[str]",
            method: str) -> dict:
    request = BuildRequest(str(model), ArchConfig(), samples(refdata, inputs, "calib"),
                           log=lambda message: None, calibrate=method)
    state = run_steps(BuildState(request), ("read", "float-passes"))
    started = time.monotonic()
    state = run_steps(state, ("quantize", "fit-architecture"))
    seconds = time.monotonic() - started
    graph = state.int_graph
    feeds = calibration_feeds(graph, normalize_samples(graph, samples(refdata, inputs, "x"),
                                                       "x"))
    got = evaluate(graph, feeds)
    record = {"method": method, "quantize_seconds": round(seconds, 1), "outputs": {}}
    for name in outputs:
        reference = refdata[f"y_{name}"].astype(np.float64)
        value = np.asarray(got[name], np.float64).reshape(reference.shape)
        spread = float(np.ptp(reference))
        entry = {"rms_share": float(np.sqrt(np.mean((value - reference) ** 2)) / spread),
                 "max_share": float(np.abs(value - reference).max() / spread)}
        if reference.ndim == 3 and reference.shape[1] == 1 and reference.shape[2] > 1:
            entry["top1"] = float(np.mean(value.argmax(-1) == reference.argmax(-1)))
        record["outputs"][name] = entry
    record["rms_share"] = max(e["rms_share"] for e in record["outputs"].values())
    record["max_share"] = max(e["max_share"] for e in record["outputs"].values())
    tops = [e["top1"] for e in record["outputs"].values() if "top1" in e]
    record["top1"] = min(tops) if tops else None
    return record


def inspect_rows(model: Path, refdata, inputs: "list[str]") -> "list[dict]":
    """What ``hwonnx inspect --calib`` compares: each method's output error on ``calib``."""
    request = BuildRequest(str(model), ArchConfig(), log=lambda message: None)
    graph = run_steps(BuildState(request), ("read", "float-passes")).float_graph
    return compare_methods(graph, normalize_samples(graph, samples(refdata, inputs, "calib"),
                                                    "calib"))


def markdown(results: list, commit: str) -> str:
    lines = ["# Calibration methods on the exporter corpus", "",
             f"Measured at {commit}. Golden model (bit-exact with the RTL) on the 8 `x` samples "
             "against onnxruntime's float outputs `y_<output>`; calibrated on the 32 `calib` "
             "samples. Errors are shares of the reference output's range over the samples, "
             "the largest over the model's outputs (RMS; largest single difference); top-1: "
             "agreement of the arg max of each score output (the lowest over the outputs; "
             "random weights, a weak measure). `hwonnx inspect --calib` suggests the method "
             "of smallest output error on the calibration samples.", "",
             "The smallest RMS error of a model is in bold; `inspect`: the RMS error `hwonnx "
             "inspect --calib` prints for the method (on the calibration samples), and the "
             "method it suggests (marked *suggested*). Quantize seconds are wall time on a "
             "shared, loaded 2-core machine.", "",
             "| model | method | RMS error | max error | top-1 | inspect | quantize s |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for entry in results:
        best = min(r["rms_share"] for r in entry["methods"])
        for r in entry["methods"]:
            rms = f"{r['rms_share']:.2%}"
            top1 = "-" if r["top1"] is None else f"{r['top1']:.0%}"
            chosen = " *suggested*" if r["method"] == entry["suggested"] else ""
            lines.append(f"| {entry['model']} | {r['method']} | "
                         f"{'**' + rms + '**' if r['rms_share'] == best else rms} | "
                         f"{r['max_share']:.2%} | {top1} | {r['inspect_error']:.2%}{chosen} | "
                         f"{r['quantize_seconds']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path, help="the corpus folder")
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma-separated model names (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    manifest = json.loads((args.corpus / "manifest.json").read_text())["models"]
    commit = measured_commit("bench")
    results = []
    for name in args.models.split(","):
        entry = manifest[name]
        refdata = np.load(args.corpus / entry["refdata"]["file"])
        inputs = [i["name"] for i in entry["inputs"]]
        outputs = [o["name"] for o in entry["outputs"]]
        records = []
        for method in METHODS:
            records.append(measure(args.corpus / entry["file"], refdata, inputs, outputs,
                                   method))
            print(f"{name} {method}: RMS {records[-1]['rms_share']:.2%} of the range, top-1 "
                  f"{records[-1]['top1']}", flush=True)
        inspected = inspect_rows(args.corpus / entry["file"], refdata, inputs)
        for record, row in zip(records, inspected):
            record["inspect_error"] = row["error"]
        results.append({"model": name, "commit": commit, "methods": records,
                        "suggested": best_method(inspected)})
        write_results(args.out, "calibrate", results, markdown(results, commit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
