"""Running a build: loading its folder (:func:`load_build`), the golden model
(:func:`run_golden`), the RTL (:func:`run_rtl_batch`), both compared (:func:`simulate`,
``hwonnx sim``) and a board over its UART (:func:`run_board`, ``hwonnx run``). A segmented
build runs its segments in order with the host steps between them (:mod:`hwonnx.segmented`)."""

import json
import os
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from .boards import host      # called through the module: tests replace its SerialTransport
from .boards.build import build_id
from .boards.protocol import Client
from .compiler.artifact import load_program
from .compiler.folder import verify_build_folder
from .compiler.paging import truncated
from .compiler.program import Program, encode_program
from .compiler.segments import is_segmented, load_segments
from .compiler.timing import predict
from .errors import MismatchError, ModelError, QuantizationError, UsageError
from .golden import evaluate, quantize
from .ir import Graph, load_graph
from .quant import load_samples, normalize_samples
from .results import BuildResult, SimResult
from .segmented import (check_segment_cycles, first_segment_difference, golden_result,
                        rtl_result)
from .sim.trace import check_trace_path

__all__ = ["GOLDEN_BLOCK_VALUES", "MAX_CYCLES_LIMIT", "first_difference", "load_build",
           "quantize_inputs", "run_board", "run_golden", "run_rtl_batch", "simulate"]


def load_build(out_dir) -> BuildResult:
    """Load build folder ``out_dir`` once it is checked whole and unchanged
    (:func:`~hwonnx.compiler.folder.verify_build_folder`).

    Raises
    ------
    ModelError
        If the folder is not a build folder, is incomplete (no manifest, a file missing), or a
        file differs from what the build wrote; naming the file.
    """
    out = Path(out_dir)
    verify_build_folder(out)
    try:
        if not zipfile.is_zipfile(out / "graph.npz"):     # before np.load, which leaks then
            raise ValueError("graph.npz is not an .npz archive")
        graph = load_graph(out, "graph")
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError, KeyError, TypeError, AttributeError,
            zipfile.BadZipFile) as error:
        raise ModelError(f"'{out}' is not a complete hwonnx build folder (graph or report: "
                         f"{error}); rebuild it") from error
    segments = tuple(load_segments(out, graph)) if is_segmented(graph) else ()
    programs = segments or (load_program(out),)
    for value in (port.value for program in programs
                  for port in program.inputs + program.outputs):
        if value not in graph.types or graph.producer(value) is None:
            raise ModelError(f"'{out}' is not a consistent hwonnx build folder: graph.json "
                             f"has no value '{value}' of program.json; rebuild it")
    return BuildResult(out, graph, programs[0], report, segments)


#: The golden model runs the samples in blocks of about this many values (every run-time value
#: of the integer graph for one sample, counted), so that its memory does not grow with the
#: inputs.
GOLDEN_BLOCK_VALUES = 1 << 22


def _blocks(graph: Graph, inputs: "dict[str, np.ndarray]") -> "list[dict[str, np.ndarray]]":
    """``inputs`` (name -> ``[S, ...]``) cut into blocks of samples."""
    count = len(next(iter(inputs.values())))
    per_sample = sum(int(np.prod(t.shape, dtype=np.int64)) for name, t in graph.types.items()
                     if name not in graph.constants)
    step = max(1, GOLDEN_BLOCK_VALUES // max(per_sample, 1))
    return [{name: a[start:start + step] for name, a in inputs.items()}
            for start in range(0, count, step)]


def quantize_inputs(graph: Graph, program: Program, inputs: "dict[str, np.ndarray]"
                    ) -> "dict[str, np.ndarray]":
    """The accelerator's int8 inputs (int8 value -> ``[S, ...]``, one per ``program.inputs``)
    from the model's inputs: the host steps before the accelerator (if any), then each
    input's quantization, with the golden model's functions (a block of samples at a
    time)."""
    parts = [_quantize_block(graph, program, block) for block in _blocks(graph, inputs)]
    return {value: np.concatenate([part[value] for part in parts]) for value in parts[0]}


def _quantize_block(graph: Graph, program: Program, inputs: "dict[str, np.ndarray]"
                    ) -> "dict[str, np.ndarray]":
    quantizers = [graph.producer(port.value) for port in program.inputs]
    feeds = {name: inputs[name].reshape((-1,) + graph.types[name].shape[1:])
             for name in graph.inputs}
    wanted = tuple(n.inputs[0] for n in quantizers if n.inputs[0] not in feeds)
    if wanted:
        prefix = Graph(_upstream(graph, wanted), graph.inputs, wanted, graph.types,
                       graph.constants)
        feeds = {**feeds, **evaluate(prefix, feeds)}
    return {node.outputs[0]: quantize(feeds[node.inputs[0]], **dict(node.attrs))
            for node in quantizers}


def _upstream(graph: Graph, values: "tuple[str, ...]") -> "list":
    """The nodes ``values`` depend on, in graph order."""
    needed, nodes = set(values), []
    for node in reversed(graph.nodes):
        if needed & set(node.outputs):
            nodes.append(node)
            needed.update(node.inputs)
    return nodes[::-1]


def _host_outputs(graph: Graph, inputs: "dict[str, np.ndarray]", q: "dict[str, np.ndarray]"
                  ) -> "dict[str, np.ndarray]":
    """The model's outputs from the accelerator's int8 outputs ``q`` (by value): their
    dequantization and any host steps after it (a final Softmax), with the golden model's
    host functions; a graph input that is also an output is passed through from ``inputs``.
    Only the nodes after the Dequantizes run (not the accelerator's nodes that read an output
    consumed further on)."""
    after, made = [], set()
    for node in graph.nodes:
        if node.op == "Dequantize" or made & set(node.inputs):
            after.append(node)
            made.update(node.outputs)
    feeds = {name: inputs[name].reshape((-1,) + graph.types[name].shape[1:])
             for name in graph.inputs if name in graph.outputs}
    return evaluate(replace(graph, nodes=tuple(after)), {**feeds, **q}, downstream=True)


def _golden_values(graph: Graph, program: Program, q_in: "dict[str, np.ndarray]"
                   ) -> "dict[str, np.ndarray]":
    """Every value of the integer graph for the int8 inputs ``q_in`` (by value)."""
    feeds = {value: q.reshape((-1,) + program.placements[value].shape[1:])
             for value, q in q_in.items()}
    return evaluate(graph, feeds, keep_all=True, downstream=True)


def run_golden(build_result: BuildResult, inputs: "dict[str, np.ndarray]") -> SimResult:
    if build_result.segments:
        return golden_result(build_result, inputs)
    graph, program = build_result.graph, build_result.program
    parts = []
    for block in _blocks(graph, inputs):          # memory bounded whatever the sample count
        env = _golden_values(graph, program, _quantize_block(graph, program, block))
        parts.append([env[port.value] for port in program.outputs])
    return _result(build_result, inputs,
                   {port.value: np.concatenate([part[i] for part in parts])
                    for i, port in enumerate(program.outputs)}, [], 0.0)


def run_rtl_batch(build_result: BuildResult, inputs: "dict[str, np.ndarray]",
                  log=print, *, max_cycles: "int | None" = None, trace=None) -> SimResult:
    """Run ``inputs`` on the RTL; ``max_cycles`` per sample (default: from the prediction,
    see :func:`hwonnx.sim.execute_rtl`); ``trace``: dump the run's waveforms into this
    ``.vcd`` or ``.fst`` file (:func:`hwonnx.sim.execute_program`)."""
    from .sim import execute_program      # the simulator loads on first use (hwonnx.sim)
    if build_result.segments:
        return rtl_result(build_result, inputs, log, max_cycles)
    graph, program = build_result.graph, build_result.program
    q_in = quantize_inputs(graph, program, inputs)
    traced = {} if trace is None else {"trace": trace}
    q_out, run = execute_program(program, _placed(program, q_in), log=log,
                                 max_cycles=max_cycles, **traced)
    q_out = {value: q.reshape((-1,) + program.placements[value].shape[1:])
             for value, q in q_out.items()}
    result = _result(build_result, inputs, q_out, list(run.cycles), run.cycles_per_second)
    result.steady_cycles_per_second = run.steady_cycles_per_second
    result.startup_seconds = run.startup_seconds
    return result


def _placed(program: Program, q: "dict[str, np.ndarray]") -> "dict[str, np.ndarray]":
    """``q`` (value -> ``[S, ...]``) in the placements' shapes, ``[S, 1, ...]``."""
    return {value: a.reshape((-1,) + program.placements[value].shape) for value, a in q.items()}


def _result(build_result, inputs, q_out: "dict[str, np.ndarray]", cycles, speed) -> SimResult:
    program = build_result.program
    return SimResult(_host_outputs(build_result.graph, inputs, q_out), q_out, cycles,
                     predict(program.expanded(), program.config).total, program.macs,
                     program.config.rows * program.config.cols, speed)


def first_difference(build_result: BuildResult, inputs: "dict[str, np.ndarray]",
                     sample: int, log=print) -> str:
    """Name the first layer whose RTL output differs from golden for ``sample``, and the
    first differing index, by running the program truncated after each layer; of a
    segmented build, the first segment too (each run on the golden model's inputs)."""
    from .sim import execute_program      # the simulator loads on first use (hwonnx.sim)
    if build_result.segments:
        return first_segment_difference(build_result.graph, list(build_result.segments),
                                        inputs, sample, log)
    graph, program = build_result.graph, build_result.program
    q_in = {value: q[sample:sample + 1]
            for value, q in quantize_inputs(graph, program, inputs).items()}
    env = _golden_values(graph, program, q_in)
    layers = program.layers
    for index, layer in enumerate(layers):
        # a tensor is read once its last band is written; one in the external memory is not
        # read (its next readers show a difference)
        if layer.output not in program.placements or (
                index + 1 < len(layers) and layers[index + 1].output == layer.output):
            continue
        partial = truncated(program, index)
        got, _ = execute_program(partial, _placed(program, q_in), [layer.output], log=log)
        want = env[layer.output]
        got = got[layer.output].reshape(want.shape)
        if not np.array_equal(got, want):
            where = tuple(int(i) for i in np.argwhere(got != want)[0])
            return (f"sample {sample}: layer '{layer.name}' ({layer.op}) output differs first "
                    f"at index {where}: RTL {int(got[where])}, golden {int(want[where])}")
    return f"sample {sample}: every layer output matches; the difference is in the host I/O"


#: The largest cycle limit the simulation harness counts to (a 32-bit signed counter).
MAX_CYCLES_LIMIT = (1 << 31) - 2


def _input_samples(graph: Graph, inputs) -> "dict[str, np.ndarray]":
    """``name -> [S, ...]`` float32 from ``inputs``: a dict of arrays keyed by input name, one
    array for a single-input model, or a sample file path (as ``--input`` takes)."""
    float_inputs = {name: graph.types[name] for name in graph.inputs}
    shell = Graph((), tuple(float_inputs), (), float_inputs,
                  meta={"batches": dict(graph.meta.get("batches", {}))})
    if isinstance(inputs, np.ndarray):
        if len(float_inputs) != 1:
            raise UsageError(f"Input data is one array, but the model has {len(float_inputs)} "
                             f"inputs ({', '.join(repr(n) for n in float_inputs)}); pass a "
                             f"dict of arrays keyed by input name")
        inputs = {next(iter(float_inputs)): inputs}
    if isinstance(inputs, dict):
        samples = normalize_samples(shell, inputs, "Input data")
    elif isinstance(inputs, (str, os.PathLike)):
        samples = load_samples(inputs, shell, "Input file")
    else:
        raise UsageError(f"Input data must be a dict of arrays keyed by input name, one NumPy "
                         f"array (single-input model) or a sample file path, not "
                         f"{type(inputs).__name__}")
    for name, array in samples.items():
        if not np.isfinite(array).all():
            raise QuantizationError(f"Input data for input '{name}' holds NaN or infinite "
                                    f"values")
    return samples


def _check_trace(trace, mode: str) -> Path:
    """The trace file ``trace`` of :func:`simulate`, checked before anything runs."""
    if mode == "golden":
        raise UsageError("--trace records the RTL simulation, and --golden runs none")
    return check_trace_path(trace)


def _announce_trace(result: BuildResult, samples: "dict[str, np.ndarray]", trace: Path,
                    log) -> None:
    """Refuse a segmented build; say what the trace holds (it grows with the cycles)."""
    if result.segments:
        raise UsageError(f"--trace records one program's run, and '{result.out_dir}' is a "
                         f"segmented build ({len(result.segments)} programs with host steps "
                         f"between them)")
    count = len(next(iter(samples.values())))
    program = result.program
    cycles = predict(program.expanded(), program.config).total
    log(f"Tracing {count} sample(s) of {cycles:,} predicted cycles each into {trace} (a trace "
        f"grows with the cycles: trace a few samples) ...")


def simulate(out_dir, inputs, *, mode: str = "rtl", max_cycles: "int | None" = None,
             log=print, trace=None) -> SimResult:
    """Run a build on ``inputs``: ``name -> [S, ...]``, one array ``[S, ...]`` for a
    single-input model, or a sample file path (as ``hwonnx sim --input`` takes).

    ``mode``: ``"rtl"`` (Verilator), ``"golden"`` (the NumPy golden model) or ``"compare"``
    (both; raises :class:`MismatchError` naming the first differing layer and index, or the
    first sample whose simulated cycles differ from the prediction). ``max_cycles``: the
    cycles a sample may take on the RTL before the run is stopped (default: twice the
    prediction plus 10,000). A segmented build runs its segments in order with the host steps
    between them (:mod:`hwonnx.segmented`); compare mode names the segment too.

    ``trace``: a ``.vcd`` or ``.fst`` file to dump the waveforms of the RTL run into (every
    sample of ``inputs``: trace few, a trace grows with the cycles), with the GTKWave save
    file ``<trace>.gtkw`` beside it (:mod:`hwonnx.sim.trace`).

    Raises
    ------
    UsageError
        If ``inputs`` is one array for a model of several inputs, or of another type, or
        ``max_cycles`` is not from 1 to :data:`MAX_CYCLES_LIMIT`; if ``trace`` is not a
        ``.vcd`` or ``.fst`` file that can be written, or is given for the golden model or a
        segmented build.
    SimulationError
        If a sample runs longer than ``max_cycles``: the message gives the accelerator's
        state (the instruction it stopped at, the last one dispatched, the busy engines).
    """
    if mode not in ("rtl", "golden", "compare"):
        raise ValueError(f"Unknown simulation mode {mode!r}")
    if max_cycles is not None and (not isinstance(max_cycles, int) or isinstance(
            max_cycles, bool) or not 1 <= max_cycles <= MAX_CYCLES_LIMIT):
        raise UsageError(f"The cycle limit (--max-cycles) must be an integer from 1 to "
                         f"{MAX_CYCLES_LIMIT:,}, not {max_cycles!r}")
    if trace is not None:
        trace = _check_trace(trace, mode)
    result = out_dir if isinstance(out_dir, BuildResult) else load_build(out_dir)
    samples = _input_samples(result.graph, inputs)
    if mode == "golden":
        return run_golden(result, samples)
    traced = {}
    if trace is not None:
        _announce_trace(result, samples, trace, log)
        traced["trace"] = trace
    rtl = run_rtl_batch(result, samples, log=log, max_cycles=max_cycles, **traced)
    if mode == "rtl":
        return rtl
    golden = run_golden(result, samples)
    ports = [port for program in result.programs for port in program.outputs]
    for port in ports:
        got, want = rtl.int_values[port.value], golden.int_values[port.value]
        if np.array_equal(got, want):
            continue
        sample = int(np.argwhere((got != want).reshape(len(got), -1).any(axis=1))[0][0])
        which = f" in output '{port.name}'" if len(ports) > 1 else ""
        raise MismatchError(f"RTL differs from the golden model{which}: "
                            + first_difference(result, samples, sample, log=log))
    if rtl.segment_cycles:
        check_segment_cycles(rtl)
    for sample, cycles in enumerate(rtl.cycles):
        if cycles != rtl.predicted_cycles:
            raise MismatchError(f"RTL cycles differ from the prediction: sample {sample} took "
                                f"{cycles:,} cycles, predicted {rtl.predicted_cycles:,}")
    return rtl


def run_board(out_dir, port: str, inputs, *, baud: "int | None" = None, log=print) -> SimResult:
    """Run ``inputs`` on a board programmed with the board build ``out_dir``, over its UART
    (``hwonnx run``); checks first that the board holds this very build, then that it counts
    the program's cycles for every sample (``boards.host.cycle_window``), and stops the whole
    run at a deadline reckoned from the bytes, the baud rate and the cycles
    (``boards.host.run_budget``)."""
    if baud is not None and (isinstance(baud, bool) or not isinstance(baud, int) or baud < 1):
        raise UsageError(f"The baud rate must be a positive whole number, not {baud!r}")
    result = load_build(out_dir)
    if result.segments:         # a segmented build is never a board build (build refuses)
        raise UsageError(f"'{out_dir}' is a segmented simulation build; run it with 'hwonnx "
                         f"sim'")
    info_file = Path(out_dir) / "board" / "hwonnx_board.json"
    if not info_file.exists():
        raise UsageError(f"'{out_dir}' is a simulation build; build it with --board B first")
    try:
        info = json.loads(info_file.read_text())
        baud = baud or int(info["baud"])
        if baud < 1:
            raise ValueError(f"baud {baud}")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ModelError(f"'{info_file}' is not a board description ({error}); rebuild "
                         f"'{out_dir}'") from error
    samples = _input_samples(result.graph, inputs)
    program, cfg = result.program, result.program.config
    in_places, reads, words = host.host_io(program,
                                           quantize_inputs(result.graph, program, samples))
    window = host.cycle_window(program)
    program_words, image = encode_program(program), program.images.get("ext", [])
    budget = host.run_budget(cfg, len(program_words), len(image), words, reads, window[1], baud)
    timeout = 1.0 + 2 * window[1] / cfg.clock_hz
    with host.SerialTransport(port, baud, timeout=timeout) as transport:
        transport.set_deadline(*budget)
        client = Client(transport)
        client.verify(cfg, build_id(program))
        host.send_program(client, cfg, program_words)
        if not host.send_external(client, cfg, image, log=log) and image:
            log(f"The board's external memory already holds this build's {len(image):,} "
                f"words (SUMX); not loading them again")
        log(f"Board on {port} holds build 0x{build_id(program):08X}; running {len(words)} "
            f"sample(s) ...")
        raw, cycles = host.run_samples(client, cfg, in_places, reads, words, window)
    q_out = {value: array.reshape((-1,) + program.placements[value].shape[1:])
             for value, array in host.unpack_outputs(program, raw).items()}
    return _result(result, samples, q_out, cycles, 0.0)
