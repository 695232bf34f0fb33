"""One point of a sweep, as a Dask task: :func:`run_task` runs on a worker, writes the model
and its data into a folder of its own and evaluates the point in a child process
(``python -m hwonnx.explore.point FOLDER``), which it stops at the timeout. The child
compiles (predicted cycles), runs the fit check, and with the options builds the bitstream
(Fmax and resources from nextpnr) and runs samples on the RTL against the golden model.

A record is a JSON object: the point (``board``, ``rows``, ``cols``, ``depths``,
``bitstream``, ``sim``), its ``key``, ``status`` (:data:`STATUSES`), ``reason`` (why it did not
succeed), and what was measured (``predicted_cycles``, ``latency_s``, ``resources``, ...)."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import replace
from pathlib import Path

import numpy as np

__all__ = ["STATUSES", "FINISHED", "run_task", "evaluate"]

#: ``ok``: built (and bitstream, simulation) as asked; ``does-not-fit``: the fit check refused
#: it on the board; ``failed``: an error (the reason says which); ``timeout``: stopped at the
#: time limit.
STATUSES = ("ok", "does-not-fit", "failed", "timeout")
#: What ``--resume`` keeps: the outcomes that running the point again would repeat.
FINISHED = ("ok", "does-not-fit")

def device_capacity(board) -> "dict[str, int] | None":
    """The board's DSP blocks, block RAMs and LUTs (None for the simulation target)."""
    if board.is_simulation:
        return None
    return {"dsp": board.dsp, "bram": board.bram_kbits * 1024 // board.family_info.block_bits,
            "luts": board.luts}


# The child process ---------------------------------------------------------------------------

def _timing(record: dict, board, cycles: int, fmax_mhz: "float | None") -> None:
    """Latency and throughput of ``cycles`` at Fmax when known, else at the board clock."""
    hz = fmax_mhz * 1e6 if fmax_mhz else board.clock_hz
    record.update(predicted_cycles=int(cycles), clock_mhz=board.clock_hz / 1e6,
                  fmax_mhz=fmax_mhz, latency_clock="fmax" if fmax_mhz else "board clock",
                  latency_s=cycles / hz, latency_at_board_clock_s=cycles / board.clock_hz,
                  throughput_per_s=hz / cycles if cycles else None)


def _estimate(config, board) -> "dict[str, int]":
    from ..boards import estimate
    usage = estimate(config, board)
    return {"dsp": usage.dsp, "bram": usage.bram_blocks, "luts": usage.luts}


def _unfitted(model, calib, shapes, board, spec: dict, log) -> dict:
    """What a point that does not fit would take: the cycles and the fit check's estimate of
    its configuration with the buffers sized to the model (as ``build`` sizes them before the
    check; nothing is tried smaller)."""
    from ..compiler.timing import predict
    from ..fitting import configure_arch
    from ..pipeline import compile_programs

    depths = spec["depths"]
    config = board.default_config
    if not board.is_simulation:
        config = replace(config, clock_hz=board.clock_hz)
    config = configure_arch(config, rows=spec["rows"], cols=spec["cols"], **depths)
    fixed = {name[:-len("_depth")] if name.endswith("_depth") else "lut" for name in depths}
    _, programs = compile_programs(model, calib, config=config, input_shapes=shapes, log=log,
                                   size="sim" if board.is_simulation else board.name,
                                   fixed=fixed, calibrate=spec.get("calibrate", "minmax"))
    record = {"config": programs[0].config.to_dict(),
              "estimate": _estimate(programs[0].config, board)}
    _timing(record, board, sum(predict(p.expanded(), p.config).total for p in programs), None)
    return record


def evaluate(spec: dict, folder: Path, log=print) -> dict:
    """Evaluate the point ``spec`` whose model (``model.onnx``), calibration data
    (``calib.npz``) and simulation inputs (``inputs.npz``) are in ``folder``; the bitstream is
    built in ``folder/build``. Returns the measured part of the record."""
    from ..api import build, simulate
    from ..boards import get_board
    from ..boards.build import nextpnr_resources
    from ..errors import ResourceError

    board = get_board(spec["board"])
    model = folder / "model.onnx"
    calib = _arrays(folder / "calib.npz")
    shapes = {k: tuple(v) for k, v in (spec.get("input_shapes") or {}).items()} or None
    depths = spec["depths"]
    try:
        result = build(model, folder / "build" if spec["bitstream"] else None,
                       board=board.name, calib=calib, rows=spec["rows"], cols=spec["cols"],
                       input_shapes=shapes, verilog=False, bitstream=spec["bitstream"],
                       log=log, calibrate=spec.get("calibrate", "minmax"), **depths)
    except ResourceError as error:
        record = {"status": "does-not-fit", "reason": str(error)}
        try:
            record.update(_unfitted(model, calib, shapes, board, spec, log))
        except Exception as other:          # what it would take is only a note
            log(f"No prediction for the configuration that does not fit: {other}")
        return record
    config = result.program.config
    record = {"status": "ok", "reason": None, "config": config.to_dict(),
              "estimate": _estimate(config, board), "device": device_capacity(board),
              "macs": int(result.report["total"]["macs"]),
              "utilization": result.report["total"]["utilization"],
              "instructions": sum(len(p.instructions) for p in result.programs)}
    bitstream = result.report.get("bitstream")
    measured = {}
    if bitstream:
        measured = {name: used for name, used in
                    nextpnr_resources(board.family, bitstream["utilization"]).items()
                    if name in record["estimate"]}
        record["bitstream"] = {k: bitstream.get(k) for k in ("fmax_mhz", "target_mhz",
                                                            "seconds", "utilization")}
    record["resources"] = {**record["estimate"], **measured}
    record["resources_source"] = {name: "nextpnr" if name in measured else "estimate"
                                  for name in record["estimate"]}
    _timing(record, board, result.report["total"]["predicted_cycles"],
            bitstream["fmax_mhz"] if bitstream else None)
    if spec["sim"]:
        samples = _arrays(folder / "inputs.npz")
        rtl = simulate(result, samples, mode="compare", log=log)   # MismatchError: failed
        record["sim"] = {"samples": len(rtl.cycles), "bit_exact": True,
                         "cycles": int(np.mean(rtl.cycles)),
                         "cycles_equal_prediction": True}
    return record


def _arrays(path: Path) -> "dict[str, np.ndarray] | None":
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


#: Seconds a point's process group has to clean up (temporary folders) after SIGTERM.
GRACE = 10


def _watch_parent() -> None:
    """End this process and its children (a bitstream build's tools, a Verilator build) when
    the worker that started it goes away (a cluster shut down, a sweep interrupted): SIGTERM
    to the process group, which ends this process through :class:`SystemExit` so that its
    temporary folders are removed, then SIGKILL after :data:`GRACE` seconds."""
    if not hasattr(os, "killpg"):
        return
    parent = os.getppid()
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))

    def watch():
        while os.getppid() == parent:
            time.sleep(1)
        os.killpg(0, signal.SIGTERM)
        time.sleep(GRACE)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()


def main(argv=None) -> int:
    """``python -m hwonnx.explore.point FOLDER``: evaluate ``FOLDER/spec.json`` and write
    ``FOLDER/result.json``; the messages go to stdout."""
    import logging

    from ..errors import HwonnxError
    from .files import write_json

    folder = Path((argv or sys.argv[1:])[0])
    _watch_parent()
    logging.basicConfig(level=logging.WARNING)
    spec = json.loads((folder / "spec.json").read_text())
    try:
        record = evaluate(spec, folder, log=lambda message: print(message, flush=True))
    except HwonnxError as error:
        record = {"status": "failed", "reason": f"{type(error).__name__}: {error}"}
    except Exception as error:          # a bug: its traceback goes to the point's log
        traceback.print_exc()
        record = {"status": "failed", "reason": f"internal error ({type(error).__name__}: "
                                                f"{error}); the traceback is in 'log'"}
    write_json(folder / "result.json", record)
    return 0


# The Dask task ------------------------------------------------------------------------------

def _kill(process: subprocess.Popen) -> None:
    """Stop ``process`` and everything it started (its own process group): SIGTERM, then
    SIGKILL after :data:`GRACE` seconds."""
    if not hasattr(os, "killpg"):
        process.kill()
        process.wait()
        return
    for number in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, number)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=GRACE)
            break
        except subprocess.TimeoutExpired:
            continue
    # the group may outlive its leader (a tool that ignores SIGTERM)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def _tail(path: Path, lines: int = 20) -> "list[str]":
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def run_task(point: dict, key: str, payload: dict, timeout: "float | None") -> dict:
    """Evaluate ``point`` (:meth:`~hwonnx.explore.space.Point.to_dict`) in a child process
    and return its record. ``payload``: ``model`` (the ONNX bytes), ``calib`` and ``inputs``
    (``.npz`` bytes or None), ``input_shapes``. Runs on a Dask worker: everything is written
    into a temporary folder of its own, removed at the end."""
    started = time.monotonic()
    record = {"key": key, **point, "array": f"{point['rows']}x{point['cols']}",
              "host": socket.gethostname()}
    with tempfile.TemporaryDirectory(prefix=f"hwonnx-explore-{key}-") as tmp:
        folder = Path(tmp)
        (folder / "model.onnx").write_bytes(payload["model"])
        for name in ("calib", "inputs"):
            if payload.get(name) is not None:
                (folder / f"{name}.npz").write_bytes(payload[name])
        (folder / "spec.json").write_text(json.dumps(
            {**point, "input_shapes": payload.get("input_shapes"),
             "calibrate": payload.get("calibrate", "minmax")}))
        log_file = folder / "log.txt"
        with open(log_file, "wb") as stream:
            process = subprocess.Popen(
                [sys.executable, "-m", "hwonnx.explore.point", str(folder)], cwd=folder,
                stdin=subprocess.DEVNULL, stdout=stream, stderr=subprocess.STDOUT,
                start_new_session=True)
            try:
                code = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill(process)
                code = None
            except BaseException:
                _kill(process)
                raise
        result = folder / "result.json"
        if code is None:
            record.update(status="timeout", reason=f"stopped after {timeout:g} s (--timeout)",
                          log=_tail(log_file))
        elif result.exists():
            record.update(json.loads(result.read_text()))
            if record["status"] == "failed":
                record["log"] = _tail(log_file)
        else:
            tail = _tail(log_file)
            record.update(status="failed", log=tail, reason=f"the point's process ended with "
                          f"status {code} and no result" + (f": {tail[-1][-300:]}" if tail
                                                             else ""))
    record["seconds"] = round(time.monotonic() - started, 1)
    record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return record


if __name__ == "__main__":
    sys.exit(main())
