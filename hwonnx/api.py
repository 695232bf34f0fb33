"""The Python API: the CLI is a thin shell over these functions."""

import json
import os
import time
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from .boards import check_fits, get_board
from .compiler.artifact import load_program, save_program
from .compiler.folder import staged_folder, verify_build_folder, write_manifest
from .compiler.program import Program, encode_program
from .compiler.segments import is_segmented, load_segments
from .compiler.sizing import BUFFERS
from .compiler.timing import predict
from .config import ArchConfig
from .fitting import configure_arch, fit_board, for_architecture, lower_sized
from .errors import MismatchError, ModelError, QuantizationError, ToolchainError, UsageError
from .golden import evaluate, quantize
from .ir import Graph, load_graph, save_graph
from .report import build_report, write_report

__all__ = ["BuildResult", "SimResult", "bitstream", "build", "compile_model", "configure_arch",
           "load_build", "plan_model", "run_board", "run_golden", "run_rtl_batch", "simulate"]


@dataclass
class BuildResult:
    out_dir: "Path | None"
    graph: Graph            # the integer graph (golden model input)
    program: Program        # the program; of a segmented build, its first segment's
    report: dict
    #: A segmented build's programs, one per segment in order (``docs/architecture.md``,
    #: "Host steps and program segments"); empty for a build of one program.
    segments: "tuple[Program, ...]" = ()


@dataclass
class SimResult:
    outputs: "dict[str, np.ndarray]"      # graph output name -> [S, ...] in the model's type
    #: int8 value the accelerator outputs -> [S, ...], before dequantization, in the order of
    #: ``Program.outputs`` (of a segmented build: every segment's, in order)
    int_values: "dict[str, np.ndarray]"
    cycles: "list[int]"                   # per sample (empty for the golden model)
    predicted_cycles: int
    macs: int
    pes: int
    cycles_per_second: float = 0.0        # all clock cycles over the simulator's wall time
    #: The same over the simulation alone, from the testbench's start to its end: without the
    #: start-up of the simulator process and the loading of the Verilator model
    #: (``startup_seconds``), which dominate short runs.
    steady_cycles_per_second: float = 0.0
    startup_seconds: float = 0.0
    #: Of a segmented build: per segment, the cycles of each sample (``cycles`` is their sum
    #: per sample) and the predicted cycles (``predicted_cycles`` is their sum).
    segment_cycles: "list[list[int]]" = field(default_factory=list)
    segment_predicted: "list[int]" = field(default_factory=list)

    @property
    def int_outputs(self) -> np.ndarray:
        """The int8 output of a model with one accelerator output (else see ``int_values``)."""
        if len(self.int_values) != 1:       # a caller that handles one output only: a bug
            raise ValueError(f"The model has {len(self.int_values)} accelerator outputs; "
                             f"use SimResult.int_values")
        return next(iter(self.int_values.values()))

    @property
    def utilization(self) -> float:
        if not self.cycles:
            return 0.0
        return self.macs / (float(np.mean(self.cycles)) * self.pes)


def compile_model(model, calib, *, config: ArchConfig, input_shapes=None,
                  override_initializers=None, log=print, size: "str | None" = None,
                  fixed=()) -> "tuple[Graph, Program]":
    """Frontend, quantizer and compiler, in memory. ``calib`` (samples or a sample file) may
    be None for a pre-quantized model that gives every quantization parameter; otherwise
    :func:`~hwonnx.quant.quantize_graph` raises :class:`QuantizationError`. Host steps at the
    start and end of the graph stay float (:func:`~hwonnx.quant.quantize_model`).

    ``size`` ``"sim"`` or a board's name sizes the buffers not named in ``fixed`` to the model
    (:mod:`hwonnx.compiler.sizing`); None keeps ``config`` as it is. For a model with host
    steps between accelerator segments (``graph.meta["segments"]``) the second item is the
    list of the segments' programs, all for one architecture."""
    from .frontend import load_model
    from .quant import load_samples, normalize_samples, quantize_model

    started = time.monotonic()
    float_graph = load_model(model, input_shapes=input_shapes,
                             override_initializers=override_initializers)
    if calib is None:       # enough when the model gives every quantization parameter
        samples = None
    elif isinstance(calib, dict):
        samples = normalize_samples(float_graph, calib, "Calibration data")
    else:
        samples = load_samples(calib, float_graph, "Calibration file")
    int_graph = for_architecture(quantize_model(float_graph, samples), config, log)
    program = lower_sized(int_graph, config, size, fixed)
    programs = program if isinstance(program, list) else [program]
    parts = f" in {len(programs)} segments" if len(programs) > 1 else ""
    log(f"Compiled {sum(len(p.layers) for p in programs)} layer(s), "
        f"{sum(len(p.instructions) for p in programs)} instructions, "
        f"{sum(p.macs for p in programs):,} MACs{parts} in {time.monotonic() - started:.1f} s")
    return int_graph, program


def model_label(model) -> str:
    """How reports name ``model``: its path, or for a ``ModelProto`` given in memory its
    graph's name (not the whole message)."""
    if isinstance(model, (str, os.PathLike)):
        return str(model)
    name = getattr(getattr(model, "graph", None), "name", "")
    return f"in-memory model (graph '{name}')" if name else "in-memory model"


def build(model, out_dir, *, board: str = "sim", calib=None, config: "ArchConfig | None" = None,
          rows: "int | None" = None, cols: "int | None" = None, input_shapes=None,
          override_initializers=None, ext_memory: "str | None" = None,
          verilog: bool = True, bitstream: bool = False, baud: "int | None" = None,
          log=print, **depths: int) -> BuildResult:
    """Compile ``model`` for ``board`` and write the build folder ``out_dir``: Verilog, program
    and memory images, architecture config (JSON), integer graph and report. ``rows``,
    ``cols``, ``<buffer>_depth`` (``stage_in_depth`` too) and ``lut_tables`` keywords override
    the board's default configuration; ``ext_memory`` adds an external memory
    (:data:`hwonnx.memories.MEMORIES`) from which the weights that do not fit stream;
    ``baud`` sets a board build's UART rate (default 115,200: ``hwonnx run`` loads an external
    memory's image over it)."""
    stages = ("stage_in", "stage_out")      # the buffers but the tables: <name>_depth
    unknown = set(depths) - {f"{b}_depth" for b in (*BUFFERS[:-1], *stages)} - {"lut_tables"}
    if unknown:
        raise TypeError(f"build() got unexpected keyword argument(s) {sorted(unknown)}")
    target = get_board(board)
    # The board's default depths are sized to the model; a config given whole is kept.
    size = None if config else ("sim" if target.is_simulation else target.name)
    array_free = config is None and rows is None and cols is None
    fixed = {name for name in (*BUFFERS, *stages) if f"{name}_depth" in depths
             or (name == "lut" and "lut_tables" in depths)}
    config = config or target.default_config
    if not target.is_simulation:
        config = replace(config, clock_hz=target.clock_hz)
    if ext_memory is not None and not target.is_simulation and ext_memory != target.ext_memory:
        raise UsageError(f"Board '{board}' has no external memory '{ext_memory}'" + (
            f"; its memory is '{target.ext_memory}'" if target.ext_memory else ""))
    config = configure_arch(config, ext_memory, rows=rows, cols=cols, **depths)
    if not target.is_simulation and size is None:
        check_fits(config, target)          # before any compilation or synthesis
    if bitstream and out_dir is None:
        raise UsageError("--bitstream needs an output folder")
    if baud is not None:
        if target.is_simulation:
            raise UsageError("--baud sets a board's UART: it needs --board")
        from .boards.top import uart_divisor
        uart_divisor(target.clock_hz, baud)        # refused before any compilation
    if bitstream and target.is_simulation:
        raise UsageError("--bitstream needs a board: the 'sim' target has no bitstream")
    if bitstream:
        from .boards.build import YOWASP_TOOLS
        if target.family not in YOWASP_TOOLS:     # before anything is compiled or written
            raise ToolchainError(f"Board '{board}' needs {target.family_info.toolchain} to "
                                 f"build a bitstream; build without --bitstream for its "
                                 f"complete project")

    def compile_():
        graph, program = compile_model(model, calib, config=config, input_shapes=input_shapes,
                                       override_initializers=override_initializers, log=log,
                                       size=size, fixed=fixed)
        if isinstance(program, list):
            from .segmented import segmented_build
            return segmented_build(graph, program, model_label(model), target)
        if not target.is_simulation:
            program = fit_board(graph, program, target, fixed,
                                 choose_array=array_free, log=log)
        return graph, program, build_report(program, model_label(model), board, dict(graph.meta),
                                            graph)

    if out_dir is None:
        return BuildResult(None, *compile_())
    out = Path(out_dir)
    # Everything is written into a temporary folder that replaces ``out`` only when whole.
    with staged_folder(out) as staging:
        graph, program, report, *segments = compile_()
        _write_build(staging, out, target, graph, segments[0] if segments else program, report,
                     verilog=verilog, bitstream=bitstream, log=log, baud=baud)
    log(f"Build written to {out}/ (report.md: {report['total']['predicted_cycles']:,} predicted "
        f"cycles per inference, {report['total']['utilization']:.1%} utilization)")
    return BuildResult(out, graph, program, report, *segments)


def _write_build(folder: Path, out: Path, target, graph: Graph,
                 program: "Program | tuple[Program, ...]", report: dict, *, verilog: bool,
                 bitstream: bool, log, baud: "int | None" = None) -> None:
    """Write the build into ``folder`` (the temporary folder that becomes ``out``), the
    manifest last; ``program``: the program, or a segmented build's programs (always a
    simulation build: a folder of format 4, :mod:`hwonnx.compiler.segments`)."""
    from .boards.build import build_id

    if isinstance(program, tuple):
        from .segmented import write_segmented_build
        return write_segmented_build(folder, graph, list(program), report, verilog, log)
    save_program(program, folder)
    save_graph(graph, folder, "graph")
    write_report(report, folder)
    if verilog:
        from .sim.runner import accelerator_verilog
        (folder / "accel.v").write_text(accelerator_verilog(program.config, log))
    if not target.is_simulation:
        from .boards.build import build_bitstream, write_board_plan
        write_board_plan(target, program, folder, log=log, shown=out,
                         **({"baud": baud} if baud else {}))
        if bitstream:
            report["bitstream"] = build_bitstream(target, folder, log=log, shown=out)
            write_report(report, folder)
    write_manifest(folder, build_id=build_id(program), board=target.name)


def bitstream(out_dir, log=print) -> dict:
    """Build the bitstream of a board build folder (``hwonnx bitstream OUT``): the build is
    checked (:func:`~hwonnx.compiler.folder.verify_build_folder`), copied into a temporary
    folder where the bitstream is built, and the copy with its new manifest replaces the
    folder; the report gets the bitstream's results as with ``build(..., bitstream=True)``."""
    from .boards.build import build_bitstream

    out = Path(out_dir)
    manifest = {}

    def check(folder):
        manifest.update(verify_build_folder(folder))
        if "board/hwonnx_board.json" not in manifest["files"]:
            raise UsageError(f"'{out_dir}' holds no board build; run 'hwonnx build MODEL "
                             f"--board B -o {out_dir}' first")

    with staged_folder(out, copy=True, check=check) as staging:
        listed = manifest["files"]
        board = get_board(manifest["board"])
        result = build_bitstream(board, staging, log=log, shown=out)
        report = json.loads((staging / "report.json").read_text())
        report["bitstream"] = result
        write_report(report, staging)
        # The user's own files in the folder (outputs of 'hwonnx sim') stay unlisted.
        from .compiler.folder import BUILD_NAMES
        write_manifest(staging, build_id=int(manifest["build_id"], 16), board=board.name,
                       only=lambda rel: rel in listed or rel.split("/")[0] in BUILD_NAMES)
    return result


def run_board(out_dir, port: str, inputs, *, baud: "int | None" = None, log=print) -> SimResult:
    """Run ``inputs`` on a board programmed with the board build ``out_dir``, over its UART
    (``hwonnx run``); checks first that the board holds this very build, then that it counts
    the program's cycles for every sample (``boards.host.cycle_window``), and stops the whole
    run at a deadline reckoned from the bytes, the baud rate and the cycles
    (``boards.host.run_budget``)."""
    from .boards.build import build_id
    from .boards.host import (SerialTransport, cycle_window, host_io, run_budget, run_samples,
                              send_external, send_program, unpack_outputs)
    from .boards.protocol import Client

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
    in_places, reads, words = host_io(program, _quantize_inputs(result.graph, program, samples))
    window = cycle_window(program)
    program_words, image = encode_program(program), program.images.get("ext", [])
    budget = run_budget(cfg, len(program_words), len(image), words, reads, window[1], baud)
    with SerialTransport(port, baud, timeout=1.0 + 2 * window[1] / cfg.clock_hz) as transport:
        transport.set_deadline(*budget)
        client = Client(transport)
        client.verify(cfg, build_id(program))
        send_program(client, cfg, program_words)
        if not send_external(client, cfg, image, log=log) and image:
            log(f"The board's external memory already holds this build's {len(image):,} "
                f"words (SUMX); not loading them again")
        log(f"Board on {port} holds build 0x{build_id(program):08X}; running {len(words)} "
            f"sample(s) ...")
        raw, cycles = run_samples(client, cfg, in_places, reads, words, window)
    q_out = {value: array.reshape((-1,) + program.placements[value].shape[1:])
             for value, array in unpack_outputs(program, raw).items()}
    return _result(result, samples, q_out, cycles, 0.0)


def plan_model(model, *, config: "ArchConfig | None" = None, input_shapes=None,
               override_initializers=None, loops: bool = True, size: "str | None" = None
               ) -> "tuple[Graph, Program]":
    """Compile ``model`` (a model, or a float graph :func:`~hwonnx.frontend.load_model`
    made) in memory without calibration data: placement, tiling and cycle prediction depend
    only on shapes and weights, not on activation ranges, so two seeded random samples stand
    in for the calibration data (any will do that are not constant, which is refused), and
    what the quantizer says of their ranges is not logged."""
    import logging

    from .frontend import load_model
    from .quant import quantize_model

    float_graph = model if isinstance(model, Graph) else load_model(
        model, input_shapes=input_shapes, override_initializers=override_initializers)
    rng = np.random.default_rng(0)
    samples = {name: rng.standard_normal((2,) + float_graph.types[name].shape).astype(
        np.float32) for name in float_graph.inputs}
    quant_log = logging.getLogger("hwonnx.quant")
    level = quant_log.level
    quant_log.setLevel(logging.ERROR)
    config = config or ArchConfig()
    try:
        int_graph = for_architecture(quantize_model(float_graph, samples), config,
                                     log=lambda message: None)
    finally:
        quant_log.setLevel(level)
    return int_graph, lower_sized(int_graph, config, size, loops=loops)


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


def _quantize_inputs(graph: Graph, program: Program, inputs: "dict[str, np.ndarray]"
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
        from .segmented import golden_result
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
    from .sim import execute_program
    if build_result.segments:
        from .segmented import rtl_result
        return rtl_result(build_result, inputs, log, max_cycles)
    graph, program = build_result.graph, build_result.program
    q_in = _quantize_inputs(graph, program, inputs)
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
    from .sim import execute_program
    if build_result.segments:
        from .segmented import first_segment_difference
        return first_segment_difference(build_result.graph, list(build_result.segments),
                                        inputs, sample, log)
    graph, program = build_result.graph, build_result.program
    q_in = {value: q[sample:sample + 1]
            for value, q in _quantize_inputs(graph, program, inputs).items()}
    env = _golden_values(graph, program, q_in)
    layers = program.layers
    for index, layer in enumerate(layers):
        # a tensor is read once its last band is written; one in the external memory is not
        # read (its next readers show a difference)
        if layer.output not in program.placements or (
                index + 1 < len(layers) and layers[index + 1].output == layer.output):
            continue
        partial = program.truncated(index)
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
    from .quant import load_samples, normalize_samples

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
    from .sim.trace import check_trace_path

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
    ports = [port for program in result.segments or (result.program,)
             for port in program.outputs]
    for port in ports:
        got, want = rtl.int_values[port.value], golden.int_values[port.value]
        if np.array_equal(got, want):
            continue
        sample = int(np.argwhere((got != want).reshape(len(got), -1).any(axis=1))[0][0])
        which = f" in output '{port.name}'" if len(ports) > 1 else ""
        raise MismatchError(f"RTL differs from the golden model{which}: "
                            + first_difference(result, samples, sample, log=log))
    if rtl.segment_cycles:
        from .segmented import check_segment_cycles
        check_segment_cycles(rtl)
    for sample, cycles in enumerate(rtl.cycles):
        if cycles != rtl.predicted_cycles:
            raise MismatchError(f"RTL cycles differ from the prediction: sample {sample} took "
                                f"{cycles:,} cycles, predicted {rtl.predicted_cycles:,}")
    return rtl
