"""Exporter corpus: every model of a corpus folder through the CLI, as a user runs it.

``python bench/bench_corpus.py CORPUS [--models a,b] [--timeout S]``, where ``CORPUS`` holds
``manifest.json``, ``models/NAME.onnx`` and ``refdata/NAME.npz`` (``calib``: 32 samples, ``x``:
8, ``y_<output>``: the reference outputs on ``x``; per input ``calib_<input>``, ``x_<input>``
when the model has several). Per model, in a subprocess each, with a timeout for the two:

- ``hwonnx build MODEL -o OUT --board sim --calib calib.npz``; when that is refused for want
  of on-chip memory (the refusal names a buffer's words), again with ``--ext-memory
  ulx3s-sdram``;
- ``hwonnx sim OUT --input x.npz --compare --output y.npz`` on the first ``--samples`` (2) of
  ``x``; when the comparison fails, ``--golden`` gives the outputs the error is measured on.

Records whether it builds (or the one-line refusal, verbatim; a traceback is kept whole),
whether the RTL is bit-exact with the golden model (the exit status and the line ``sim``
prints), simulated and predicted cycles, the largest absolute difference between hwonnx's
outputs and ``y_<output>`` as a share of the reference's range over the same samples (per
output), the build's and the simulation's wall time, and the commit. Writes
``bench/results/corpus.json`` and ``.md`` after every model, so that an interrupted run still
leaves a table of every model of the manifest ("not run in this measurement" for the rest).
The corpus folder is read only through the argument: hwonnx never reads it.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from results_io import RESULTS, measured_commit, write_results

#: Smallest first; models of the manifest not listed here run after these, by file size.
ORDER = ["keras_cnn_32", "keras_sepconv_32", "kws_1d", "se_cnn", "two_io",
         "brevitas_mlp_w2a2_qonnx", "brevitas_cnn_w4a4_qcdq", "brevitas_cnn_w4a4_qonnx",
         "tiny_yolo", "tiny_unet", "timm_lcnet_050_128", "mobilenet_v2_96",
         "shufflenet_v2_x0_5_224", "mobilenet_v3_small_224", "timm_deit_tiny_patch16_224",
         "resnet18_224"]
EXT_MEMORY = "ulx3s-sdram"
NOT_RUN = "not run in this measurement"
#: A refusal for want of on-chip memory: "The model needs N words of the wgt buffer, ...".
MEMORY_REFUSAL = re.compile(r"words of the \w+ buffer|--ext-memory")
CYCLES = re.compile(r"([\d,]+) cycles per sample \(predicted ([\d,]+)\)")


def hwonnx_command() -> list:
    """The ``hwonnx`` script of the interpreter running this one (its venv's)."""
    script = Path(sys.executable).parent / "hwonnx"
    return [str(script)] if script.exists() else [shutil.which("hwonnx") or "hwonnx"]


def commit() -> str:
    """The commit the measurement runs at (``+`` when the tree has changes outside
    ``bench/``)."""
    return measured_commit("bench")


def run(command: list, deadline: float) -> dict:
    """Runs ``command`` until ``deadline`` (time.monotonic()); on time out its process group
    is killed. Returns exit status (None on time out), stdout, stderr, wall seconds."""
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=max(1.0, deadline - started))
        status = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        status = None
    return {"status": status, "stdout": stdout, "stderr": stderr,
            "seconds": round(time.monotonic() - started, 2)}


def failure(result: dict) -> tuple:
    """``(kind, text)`` of a failed command: ``timeout``, ``traceback`` (the whole of it) or
    ``refusal`` (hwonnx's one line, verbatim)."""
    if result["status"] is None:
        return "timeout", f"timed out after {result['seconds']:.0f} s"
    err = result["stderr"]
    if "Traceback (most recent call last)" in err:
        return "traceback", err[err.index("Traceback (most recent call last)"):].strip()
    lines = [line for line in err.splitlines() if line.startswith("hwonnx: error:")]
    if lines:
        return "refusal", lines[-1][len("hwonnx: error:"):].strip()
    tail = (err.strip() or result["stdout"].strip()).splitlines()[-5:]
    return "crash", f"exit status {result['status']}: " + " / ".join(tail)


def write_samples(refdata, inputs: list, folder: Path, samples: int) -> tuple:
    """calib.npz (every calibration sample) and x.npz (the first ``samples`` of ``x``), keyed
    by input name as ``--calib`` and ``--input`` take them."""
    def key(kind, name):
        return f"{kind}_{name}" if len(inputs) > 1 or kind not in refdata else kind
    calib = {name: refdata[key("calib", name)] for name in inputs}
    x = {name: refdata[key("x", name)][:samples] for name in inputs}
    np.savez(folder / "calib.npz", **calib)
    np.savez(folder / "x.npz", **x)
    return folder / "calib.npz", folder / "x.npz"


def output_errors(outputs: Path, refdata, names: list, samples: int) -> dict:
    """Per output: max |hwonnx - reference| over the samples / the reference's range there."""
    got = np.load(outputs)
    errors = {}
    for index, name in enumerate(names):
        reference = refdata[f"y_{name}"][:samples].astype(np.float64)
        value = got[name] if name in got.files else got[got.files[index]]
        value = np.asarray(value, np.float64).reshape(reference.shape)
        spread = float(reference.max() - reference.min())
        difference = float(np.abs(value - reference).max())
        errors[name] = {"max_abs_error": difference, "reference_range": spread,
                        "share_of_range": difference / spread if spread else None}
    return errors


def exporter(entry: dict) -> str:
    """The exporter, from the manifest's call: tf2onnx, torch.onnx, Brevitas QONNX / QCDQ."""
    call = entry.get("exporter", {}).get("call", "")
    for prefix, label in (("tf2onnx", "tf2onnx"), ("brevitas.export.export_qonnx",
                          "Brevitas QONNX"), ("brevitas.export.export_onnx_qcdq",
                          "Brevitas QCDQ"), ("torch.onnx", "torch.onnx")):
        if call.startswith(prefix):
            source = entry.get("source")
            return label + (f" ({source})" if label == "torch.onnx" and source else "")
    return entry.get("source") or "?"


def measure(name: str, entry: dict, corpus: Path, work: Path, timeout: float,
            samples: int) -> dict:
    model = corpus / entry["file"]
    refdata = np.load(corpus / entry["refdata"]["file"])
    inputs = [i["name"] for i in entry["inputs"]]
    outputs = [o["name"] for o in entry["outputs"]]
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    calib, x = write_samples(refdata, inputs, folder, samples)
    record = {"model": name, "exporter": exporter(entry), "commit": commit(),
              "samples": samples, "builds": False, "ext_memory": None, "bit_exact": None,
              "failure": None, "failure_kind": None, "note": ""}
    deadline = time.monotonic() + timeout
    out = folder / "build"
    hwonnx = hwonnx_command()
    command = hwonnx + ["build", str(model), "-o", str(out), "--board", "sim",
                        "--calib", str(calib)]
    build = run(command, deadline)
    record["compile_seconds"] = build["seconds"]
    if build["status"] != 0:
        kind, text = failure(build)
        if kind == "refusal" and MEMORY_REFUSAL.search(text):
            record["on_chip_refusal"] = text
            shutil.rmtree(out, ignore_errors=True)
            build = run(command + ["--ext-memory", EXT_MEMORY], deadline)
            record["ext_memory"] = EXT_MEMORY
            record["compile_seconds"] = round(record["compile_seconds"] + build["seconds"], 2)
            record["compile_seconds_ext_memory"] = build["seconds"]
    if build["status"] != 0:
        record["failure_kind"], record["failure"] = failure(build)
        record["failure_step"] = "build"
        return record
    record["builds"] = True
    report = json.loads((out / "report.json").read_text())
    record["predicted_cycles"] = report.get("total", {}).get("predicted_cycles")
    record["macs"] = report.get("total", {}).get("macs")
    printed = (build["stdout"] + build["stderr"]).splitlines()
    record["build_line"] = next((line for line in printed if line.startswith("Build written")),
                                None)
    y = folder / "y.npz"
    sim = run(hwonnx + ["sim", str(out), "--input", str(x), "--compare", "--output", str(y)],
              deadline)
    record["sim_seconds"] = sim["seconds"]
    record["sim_status"] = sim["status"]
    found = CYCLES.search(sim["stdout"])
    if found:
        record["simulated_cycles"] = int(found[1].replace(",", ""))
        record["predicted_cycles"] = int(found[2].replace(",", ""))
    if sim["status"] == 0:
        record["bit_exact"] = True
        record["compare_line"] = next((line for line in sim["stdout"].splitlines()
                                       if "golden" in line), sim["stdout"].strip())
    else:
        record["bit_exact"] = False
        record["failure_kind"], record["failure"] = failure(sim)
        record["failure_step"] = "sim"
        record["compare_line"] = record["failure"].splitlines()[-1]
        if sim["status"] is not None:        # the golden model's outputs, for the error
            shutil.rmtree(y, ignore_errors=True)
            golden = run(hwonnx + ["sim", str(out), "--input", str(x), "--golden", "--output",
                                   str(y)], time.monotonic() + 300)
            if golden["status"] == 0:
                record["error_from"] = "golden"
    if y.exists():
        try:
            record["errors"] = output_errors(y, refdata, outputs, samples)
        except Exception as error:          # noqa: BLE001 (the table says why)
            record["note"] = f"outputs not comparable: {error}"
    return record


def percent(share) -> str:
    return "–" if share is None else f"{100 * share:.2f}%"


def row(r: dict) -> str:
    if r.get("not_run"):
        return (f"| {r['model']} | {r['exporter']} | – | – | – | – | – | – | – | "
                f"{r.get('note') or NOT_RUN} |")
    builds = "yes" if r["builds"] else ("timeout" if r["failure_kind"] == "timeout" else "no")
    ext = r["ext_memory"] or "–"
    exact = {True: "yes", False: "**no**", None: "–"}[r["bit_exact"]]
    if r["bit_exact"] is False and r["failure_kind"] == "timeout":
        exact = "timeout"
    predicted, simulated = r.get("predicted_cycles"), r.get("simulated_cycles")
    cycles = (f"{predicted:,}" if predicted is not None else "–") + " / " + \
        (f"{simulated:,}" if simulated is not None else "–")
    errors = r.get("errors") or {}
    error = "; ".join((f"{name} " if len(errors) > 1 else "") + percent(e["share_of_range"])
                      for name, e in errors.items()) or "–"
    if r.get("error_from") == "golden":
        error += " (golden)"
    note = r.get("note") or ""
    if r["failure"]:
        text = r["failure"].strip().splitlines()
        shown = text[-1] if r["failure_kind"] == "traceback" else text[0]
        note = (f"{r['failure_step']} {r['failure_kind']}: {shown}" + (f"; {note}" if note
                                                                          else ""))
    elif r.get("on_chip_refusal"):
        note = "on chip: " + r["on_chip_refusal"] + (f"; {note}" if note else "")
    note = note.replace("|", "\\|").replace("\n", " ")
    sim = r.get("sim_seconds")
    return (f"| {r['model']} | {r['exporter']} | {builds} | {ext} | {exact} | {cycles} | "
            f"{error} | {r['compile_seconds']:.1f} | "
            f"{'–' if sim is None else f'{sim:.1f}'} | {note} |")


def markdown(results: list, corpus: str) -> str:
    ran = [r for r in results if not r.get("not_run")]
    builds = sum(r["builds"] for r in ran)
    exact = sum(bool(r["bit_exact"]) for r in ran)
    commits = sorted({r["commit"] for r in ran}) or ["–"]
    lines = [
        "# Exporter corpus through the CLI", "",
        f"Generated by `python bench/bench_corpus.py {corpus}`: every model of the corpus "
        "manifest, as a user runs it, in a subprocess: `hwonnx build MODEL -o OUT --board sim "
        "--calib calib.npz` (the 32 calibration samples of the model's refdata), again with "
        f"`--ext-memory {EXT_MEMORY}` when refused for want of on-chip memory, then `hwonnx sim "
        "OUT --input x.npz --compare --output y.npz` on the first samples of its `x` (bit-exact: "
        "`--compare` exits 0, the RTL equal to the golden model in every output and in the "
        "predicted cycles). The error is the largest absolute difference between hwonnx's "
        "outputs and the reference outputs `y_<output>` (onnxruntime on the float model; the "
        "qonnx executor for QONNX files) as a share of the reference's range over the same "
        "samples, per output; \"(golden)\" when `--compare` failed and the golden model's "
        "outputs were measured instead. Compile s is the build's wall time (both builds "
        "with external memory), sim s the simulation's (Verilator model build included). "
        "Random weights (see the corpus README): the error, not top-1, is the measure.", "",
        f"Measured at commit {', '.join(commits)}: {len(ran)} of {len(results)} models run, "
        f"{builds} build, {exact} bit-exact on the RTL.", "",
        "| model | exporter | builds | ext memory | bit-exact | cycles predicted / "
        "simulated | max error (% of output range) | compile s | sim s | note |",
        "|---|---|---|---|---|---:|---:|---:|---:|---|"]
    lines += [row(r) for r in results]
    failed = [r for r in ran if r["failure"]]
    if failed:
        lines += ["", "## Failures", ""]
        for r in sorted(failed, key=lambda r: r["failure_kind"] != "traceback"):
            lines += [f"### {r['model']}: {r['failure_step']} {r['failure_kind']}", "",
                      "```", r["failure"].strip(), "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path, help="the corpus folder (manifest.json)")
    parser.add_argument("--models", help="comma-separated names (default: all, smallest "
                        "first)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds per model, build and simulation (default 900)")
    parser.add_argument("--samples", type=int, default=2, help="samples of x simulated")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work", type=Path, help="folder for the builds (default: a "
                        "temporary one, removed)")
    parser.add_argument("--keep", action="store_true",
                        help="add to the results already in OUT/corpus.json: models not "
                        "named by --models keep their earlier figures")
    parser.add_argument("--not-run-note", default=NOT_RUN,
                        help=f"the note of the models not run (default: '{NOT_RUN}')")
    args = parser.parse_args(argv)
    manifest = json.loads((args.corpus / "manifest.json").read_text())["models"]
    names = [n for n in ORDER if n in manifest] + sorted(
        (n for n in manifest if n not in ORDER), key=lambda n: manifest[n]["size_bytes"])
    chosen = names if not args.models else args.models.split(",")
    unknown = [n for n in chosen if n not in manifest]
    if unknown:
        parser.error(f"not in {args.corpus / 'manifest.json'}: {', '.join(unknown)}")
    earlier = {}
    if args.keep and (args.out / "corpus.json").exists():
        earlier = {r["model"]: r for r in json.loads((args.out / "corpus.json").read_text())}
    results = {n: earlier.get(n) or {"model": n, "exporter": exporter(manifest[n]),
                                     "not_run": True, "note": args.not_run_note}
               for n in names}
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_corpus_"))
    try:
        for name in [n for n in names if n in chosen]:
            print(f"{name} ...", flush=True)
            r = measure(name, manifest[name], args.corpus, work, args.timeout, args.samples)
            results[name] = r
            errors = ", ".join(percent(e["share_of_range"]) for e in
                               (r.get("errors") or {}).values())
            ext = f" ({r['ext_memory']})" if r["ext_memory"] else ""
            print(f"{name}: builds {r['builds']}{ext}, "
                  f"bit-exact {r['bit_exact']}, cycles {r.get('predicted_cycles')} / "
                  f"{r.get('simulated_cycles')}, error {errors or '–'}, build "
                  f"{r['compile_seconds']} s, sim {r.get('sim_seconds')} s"
                  + (f"\n  {r['failure_kind']}: {r['failure'].splitlines()[-1]}"
                     if r["failure"] else ""), flush=True)
            ordered = list(results.values())
            write_results(args.out, "corpus", ordered, markdown(ordered, args.corpus))
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    ordered = list(results.values())
    write_results(args.out, "corpus", ordered, markdown(ordered, args.corpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
