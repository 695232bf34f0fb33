"""Running a sweep on Dask distributed: a ``LocalCluster`` sized to the machine, or the
cluster of ``scheduler``; each point a task (:func:`~hwonnx.explore.point.run_task`), its
record written to ``<out>/points/<key>.json`` as soon as it arrives."""

import hashlib
import io
import logging
import math
import os
import signal
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..errors import ToolchainError, UsageError
from .files import read_json, write_json
from .point import FINISHED, run_task
from .space import Point, parse_depths, sweep_points

__all__ = ["explore", "prepare", "default_timeout"]


def default_timeout(bitstream: bool, sim: int) -> float:
    """Seconds a point may take by default: 4 hours with a bitstream (an ECP5 build of a large
    array takes up to an hour when builds share the machine), 30 minutes with a simulation
    (a Verilator build per configuration), 10 minutes otherwise."""
    return 4 * 3600.0 if bitstream else 1800.0 if sim else 600.0


def _npz(arrays: "dict[str, np.ndarray] | None") -> "bytes | None":
    if arrays is None:
        return None
    stream = io.BytesIO()
    np.savez(stream, **arrays)
    return stream.getvalue()


def prepare(model, *, calib=None, input_shapes=None, sim: int = 0, inputs=None,
            calibrate: str = "minmax") -> dict:
    """What every task needs, read and checked here before any cluster starts: the model as
    ONNX bytes (external data included), the calibration samples and the first ``sim``
    samples of ``inputs`` (default: of the calibration data) as ``.npz`` bytes, the
    calibration method, and a digest of all of it (``inputs_digest``, part of each point's
    key; a sweep calibrated min/max keeps the key it had before the methods). Raises the user
    errors of
    ``hwonnx build`` (a missing model, calibration data of the wrong shape)."""
    import onnx

    from ..frontend import load_model
    from ..quant import load_samples, normalize_samples

    shapes = {name: tuple(int(d) for d in shape) for name, shape in (input_shapes or {}).items()}
    graph = load_model(model, input_shapes=shapes or None)      # ModelError for a bad model
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, bytes):
        proto = onnx.load_from_string(model)
    else:
        proto = onnx.load(str(model))           # with its external data, checked above
    model_bytes = proto.SerializeToString()

    def samples(source, what):
        if source is None:
            return None
        if isinstance(source, dict):
            return normalize_samples(graph, source, what)
        return load_samples(source, graph, what)

    calib_arrays = samples(calib, "Calibration data" if isinstance(calib, dict)
                           else "Calibration file")
    sim_arrays = None
    if sim:
        source = samples(inputs, "Input file") if inputs is not None else calib_arrays
        if source is None:
            raise UsageError("--sim needs samples: give --input, or --calib (its first "
                             "samples are simulated)")
        count = len(next(iter(source.values())))
        if count < sim:
            raise UsageError(f"--sim {sim} needs {sim} samples, but the "
                             f"{'input' if inputs is not None else 'calibration'} data has "
                             f"{count}")
        sim_arrays = {name: array[:sim] for name, array in source.items()}
    payload = {"model": model_bytes, "calib": _npz(calib_arrays), "inputs": _npz(sim_arrays),
               "input_shapes": {k: list(v) for k, v in shapes.items()} or None}
    digest = hashlib.sha256(model_bytes)
    for name in ("calib", "inputs"):
        digest.update(b"|" + (payload[name] or b""))
    digest.update(repr(sorted(shapes.items())).encode())
    if calibrate != "minmax":
        digest.update(b"|calibrate=" + calibrate.encode())
    payload["calibrate"] = calibrate
    payload["inputs_digest"] = digest.hexdigest()
    return payload


def _check_points(board, points: "list[Point]") -> None:
    """Refuse what no point can do before anything runs: an invalid architecture, a
    bitstream or simulation the target does not have."""
    from ..fitting import configure_arch

    if points and points[0].bitstream:
        if board.is_simulation:
            raise UsageError("--bitstream needs a board: the 'sim' target has no bitstream")
        from ..boards.build import YOWASP_TOOLS
        if board.family not in YOWASP_TOOLS:
            raise ToolchainError(f"Board '{board.name}' needs {board.family_info.toolchain} "
                                 f"to build a bitstream; explore it without --bitstream")
    for point in points:
        try:
            configure_arch(board.default_config, rows=point.rows, cols=point.cols,
                           **dict(point.depths))
        except Exception as error:
            raise UsageError(f"Point {point.array}: {error}") from error


@contextmanager
def _no_interrupts():
    """Start worker processes that ignore SIGINT (they inherit it): a Ctrl-C in the terminal
    reaches the whole process group, and each worker would print a traceback of its own
    while this process closes them in order."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _client(scheduler: "str | None", workers: int, processes: bool):
    """A Dask client of ``scheduler``, or of a new ``LocalCluster`` of ``workers`` single-thread
    workers (returned too, to be closed)."""
    from distributed import Client, LocalCluster

    if scheduler:
        try:
            return Client(scheduler, timeout="30s"), None
        except (OSError, TimeoutError, ValueError) as error:
            raise UsageError(f"Cannot reach the Dask scheduler at '{scheduler}': "
                             f"{error}") from error
    with _no_interrupts():      # Ctrl-C stops the sweep here; its workers are closed then
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=processes,
                               dashboard_address="127.0.0.1:0",
                               silence_logs=logging.ERROR)
    try:
        return Client(cluster), cluster
    except BaseException:
        cluster.close()
        raise


def explore(model, board: str, *, rows=(4, 8, 16), cols=(4, 8, 16), calib=None,
            depths: "dict[str, int] | str | None" = None, input_shapes=None,
            bitstream: bool = False, sim: int = 0, inputs=None, out_dir="explore",
            scheduler: "str | None" = None, workers: "int | None" = None,
            timeout: "float | None" = None, resume: bool = False, processes: bool = True,
            model_label: "str | None" = None, calib_label: "str | None" = None,
            log=print, on_start=None, on_point=None, calibrate: str = "minmax") -> dict:
    """Sweep the ``rows`` x ``cols`` arrays of ``model`` on ``board`` (each built as ``hwonnx
    build --board B --rows R --cols C`` builds it, the buffers sized to the model but the
    ``depths`` given) and write ``out_dir``: ``points/<key>.json`` per point as it finishes,
    then ``explore.json``, ``explore.md`` and ``explore.png`` (:mod:`.outputs`). Returns the
    summary that ``explore.json`` holds.

    ``bitstream``: build each point's bitstream (Fmax and nextpnr's resources); ``sim``: run
    that many samples of ``inputs`` (default: the calibration data) on the RTL against the
    golden model. ``scheduler``: the address of a Dask scheduler to send the points to;
    otherwise a ``LocalCluster`` of ``workers`` (default: one per CPU, at most one per point)
    processes (threads with ``processes=False``) runs them. ``timeout``: seconds per point
    (:func:`default_timeout`). ``resume``: keep the points of ``out_dir`` that finished
    (``ok``, ``does-not-fit``) and run the others. ``calibrate``: the calibration method of
    every point (:data:`hwonnx.quant.calibrate.METHODS`). ``on_start(total)`` is called with
    the
    number of points to run before they start, ``on_point(record, done, total)`` as each
    point's record is written. Points that fail or time out are recorded with their
    reason; the sweep goes on."""
    from ..boards import get_board
    from .outputs import summarize, write_outputs

    from ..quant.calibrate import check_method

    target = get_board(board)
    check_method(calibrate)
    if isinstance(depths, str) or depths is None:
        depths = parse_depths(depths)
    if sim < 0:
        raise UsageError(f"--sim takes a number of samples, not {sim}")
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise UsageError(f"--timeout takes a positive number of seconds, not {timeout:g}")
    points = sweep_points(target.name, rows, cols, depths, bitstream, sim)
    if not points:
        raise UsageError("The sweep has no points: give --rows and --cols")
    _check_points(target, points)
    payload = prepare(model, calib=calib, input_shapes=input_shapes, sim=sim, inputs=inputs,
                      calibrate=calibrate)
    keys = [point.key(payload["inputs_digest"]) for point in points]
    out = Path(out_dir)
    folder = out / "points"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"Cannot create the explore folder '{out}': "
                         f"{error.strerror or error}") from error
    records, todo = {}, []
    for point, key in zip(points, keys):
        record = read_json(folder / f"{key}.json") if resume else None
        if record is not None and record.get("status") in FINISHED:
            records[key] = record
        else:
            todo.append((point, key))
    if resume:
        log(f"Resuming: {len(records)} of {len(points)} point(s) finished before, "
            f"{len(todo)} to run")
    timeout = timeout or default_timeout(bitstream, sim)
    if todo:
        if on_start:
            on_start(len(todo))
        _run(todo, payload, folder, records, scheduler=scheduler, timeout=timeout,
             workers=workers or max(1, min(os.cpu_count() or 1, len(todo))),
             processes=processes, log=log, on_point=on_point)
    name = model_label or (str(model) if isinstance(model, (str, os.PathLike)) else "model")
    summary = summarize([records[key] for key in keys], board=target, model=name,
                        calib=calib_label or (str(calib) if isinstance(calib, (str, os.PathLike))
                                              else None),
                        rows=sorted(set(rows)), cols=sorted(set(cols)), depths=depths,
                        bitstream=bitstream, sim=sim)
    if calibrate != "minmax":
        summary["calibrate"] = calibrate
    write_outputs(out, summary)
    return summary


def _run(todo, payload, folder: Path, records: dict, *, scheduler, timeout, workers,
         processes, log, on_point) -> None:
    """Run the points ``todo`` (``(point, key)``), writing each record into ``folder`` and
    ``records`` as it arrives."""
    from distributed import as_completed

    where = f"the Dask scheduler at {scheduler}" if scheduler else (
        f"a local Dask cluster of {workers} {'process' if processes else 'thread'}"
        f"{'es' if processes and workers > 1 else 's' if workers > 1 else ''}")
    log(f"Running {len(todo)} point(s) on {where} (at most {timeout:g} s each) ...")
    client, cluster = _client(scheduler, workers, processes)
    futures = {}
    try:
        [data] = client.scatter([{k: v for k, v in payload.items() if k != "inputs_digest"}],
                                broadcast=True)
        run = uuid.uuid4().hex[:8]
        for point, key in todo:
            future = client.submit(run_task, point.to_dict(), key, data, timeout,
                                   key=f"hwonnx-explore-{key}-{run}", pure=False, retries=0)
            futures[future] = (point, key)
        for done, future in enumerate(as_completed(futures), 1):
            point, key = futures[future]
            try:
                record = future.result()
            except Exception as error:      # the worker died (KilledWorker), a lost connection
                record = {"key": key, **point.to_dict(), "array": point.array,
                          "status": "failed",
                          "reason": f"the Dask task failed: {type(error).__name__}: {error}"}
            write_json(folder / f"{key}.json", record)
            records[key] = record
            if on_point:
                on_point(record, done, len(todo))
    finally:
        quiet = logging.getLogger("distributed")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)    # workers leaving with their data, on an interrupt
        try:
            if futures:
                client.cancel(list(futures))
            client.close()
            if cluster is not None:
                cluster.close()
        finally:
            quiet.setLevel(level)
