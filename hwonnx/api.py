"""The Python API: the CLI is a thin shell over these functions."""

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .boards import check_fits, get_board
from .compiler.artifact import load_program, save_program
from .compiler.lower import Program, encode_program, lower
from .compiler.timing import predict
from .config import ArchConfig
from .errors import MismatchError, ModelError, QuantizationError, ResourceError, UsageError
from .golden import evaluate, quantize
from .ir import Graph, load_graph, save_graph
from .report import build_report, write_report

__all__ = ["BuildResult", "SimResult", "bitstream", "build", "compile_model", "configure_arch",
           "load_build", "plan_model", "run_board", "run_golden", "run_rtl_batch", "simulate"]


@dataclass
class BuildResult:
    out_dir: "Path | None"
    graph: Graph            # the integer graph (golden model input)
    program: Program
    report: dict


@dataclass
class SimResult:
    outputs: "dict[str, np.ndarray]"      # graph output name -> [S, ...] in the model's type
    int_outputs: np.ndarray               # int8 outputs before dequantization
    cycles: "list[int]"                   # per sample (empty for the golden model)
    predicted_cycles: int
    macs: int
    pes: int
    cycles_per_second: float = 0.0

    @property
    def utilization(self) -> float:
        if not self.cycles:
            return 0.0
        return self.macs / (float(np.mean(self.cycles)) * self.pes)


def compile_model(model, calib, *, config: ArchConfig, input_shapes=None,
                  override_initializers=None, log=print) -> "tuple[Graph, Program]":
    """Frontend, quantizer and compiler, in memory. ``calib`` (samples or a sample file) may
    be None for a pre-quantized model that gives every quantization parameter; otherwise
    :func:`~hwonnx.quant.quantize_graph` raises :class:`QuantizationError`. Host steps at the
    start and end of the graph stay float (:func:`~hwonnx.quant.quantize_model`)."""
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
    int_graph = _choose_rounding(quantize_model(float_graph, samples), config, log)
    program = lower(int_graph, config)
    log(f"Compiled {len(program.layers)} layer(s), {len(program.instructions)} instructions, "
        f"{program.macs:,} MACs in {time.monotonic() - started:.1f} s")
    return int_graph, program


def _choose_rounding(graph: Graph, config: ArchConfig, log) -> Graph:
    """Layers that keep a pre-quantized model's own parameters round as onnxruntime does when
    the architecture can (``ArchConfig.ort_rounding``); otherwise half up, which differs from
    onnxruntime by 1 LSB on exact ties."""
    layers = [n for n in graph.nodes if n.attrs.get("rounding") == "ort"]
    if not layers or config.ort_rounding:
        return graph
    log(f"{len(layers)} layer(s) of this pre-quantized model round half up: the {config.name} "
        f"architecture has no onnxruntime rounding unit (ort_rounding), so results may differ "
        f"from onnxruntime by 1 LSB on exact ties")
    return replace(graph, nodes=tuple(n.with_attrs(rounding="half_up") if n in layers else n
                                      for n in graph.nodes))


def configure_arch(config: ArchConfig, **changes: "int | None") -> ArchConfig:
    """``config`` with the ``changes`` that are not None (``rows=16``, ``wgt_depth=4096``, as
    ``hwonnx build`` and ``hwonnx inspect`` take them from their options).

    Raises
    ------
    ResourceError
        If the result is not a valid architecture: ``Invalid architecture: <why>``.
    """
    changes = {k: v for k, v in changes.items() if v is not None}
    if not changes:
        return config
    try:
        return replace(config, **changes)
    except (TypeError, ValueError) as error:
        raise ResourceError(f"Invalid architecture: {error}") from error


def build(model, out_dir, *, board: str = "sim", calib=None, config: "ArchConfig | None" = None,
          rows: "int | None" = None, cols: "int | None" = None, input_shapes=None,
          override_initializers=None,
          verilog: bool = True, bitstream: bool = False, log=print,
          **depths: int) -> BuildResult:
    """Compile ``model`` for ``board`` and write the build folder ``out_dir``: Verilog, program
    and memory images, architecture config (JSON), integer graph and report. ``rows``,
    ``cols``, ``<buffer>_depth`` and ``lut_tables`` keywords override the board's default
    configuration."""
    unknown = set(depths) - {f"{b}_depth" for b in ("act", "wgt", "acc", "par", "prog")} \
        - {"lut_tables"}
    if unknown:
        raise TypeError(f"build() got unexpected keyword argument(s) {sorted(unknown)}")
    target = get_board(board)
    config = config or target.default_config
    if not target.is_simulation:
        config = replace(config, clock_hz=target.clock_hz)
    config = configure_arch(config, rows=rows, cols=cols, **depths)
    if not target.is_simulation:
        check_fits(config, target)          # before any compilation or synthesis
    graph, program = compile_model(model, calib, config=config, input_shapes=input_shapes,
                                   override_initializers=override_initializers, log=log)
    report = build_report(program, str(model), board, dict(graph.meta), graph)
    if out_dir is None:
        if bitstream:
            raise UsageError("--bitstream needs an output folder")
        return BuildResult(None, graph, program, report)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"Cannot create the build folder '{out}': {error.strerror}") from error
    save_program(program, out)
    save_graph(graph, out, "graph")
    write_report(report, out)
    if verilog:
        from amaranth.back import verilog as amaranth_verilog

        from .hdl import Accelerator
        from .sim.harness import ACCEL_TOP
        started = time.monotonic()
        (out / "accel.v").write_text(amaranth_verilog.convert(Accelerator(config),
                                                              name=ACCEL_TOP))
        log(f"Wrote Verilog for the {config.name} array in {time.monotonic() - started:.1f} s")
    if not target.is_simulation:
        from .boards.build import build_bitstream, write_board_plan
        write_board_plan(target, program, out, log=log)
        if bitstream:
            report["bitstream"] = build_bitstream(target, out, log=log)
            write_report(report, out)
    elif bitstream:
        raise UsageError("--bitstream needs a board: the 'sim' target has no bitstream")
    log(f"Build written to {out}/ (report.md: {report['total']['predicted_cycles']:,} predicted "
        f"cycles per inference, {report['total']['utilization']:.1%} utilization)")
    return BuildResult(out, graph, program, report)


def bitstream(out_dir, log=print) -> dict:
    """Build the bitstream of a board build folder (``hwonnx bitstream OUT``)."""
    import json

    from .boards.build import build_bitstream
    info = Path(out_dir) / "board" / "hwonnx_board.json"
    if not info.exists():
        raise UsageError(f"'{out_dir}' holds no board build; run 'hwonnx build MODEL --board B "
                         f"-o {out_dir}' first")
    board = get_board(json.loads(info.read_text())["board"])
    return build_bitstream(board, Path(out_dir), log=log)


def run_board(out_dir, port: str, inputs, *, baud: "int | None" = None,
              timeout: float = 10.0, log=print) -> SimResult:
    """Run ``inputs`` on a board programmed with the board build ``out_dir``, over its UART
    (``hwonnx run``); checks first that the board holds this very build."""
    import json

    from .boards.build import build_id
    from .boards.host import SerialTransport, run_samples, send_program
    from .boards.protocol import Client
    from .compiler.layout import pack_words, unpack_words
    from .quant import load_samples, normalize_samples

    result = load_build(out_dir)
    info_file = Path(out_dir) / "board" / "hwonnx_board.json"
    if not info_file.exists():
        raise UsageError(f"'{out_dir}' is a simulation build; build it with --board B first")
    info = json.loads(info_file.read_text())
    float_inputs = {name: result.graph.types[name] for name in result.graph.inputs}
    shell = Graph((), tuple(float_inputs), (), float_inputs)
    samples = (normalize_samples(shell, inputs, "Input data") if isinstance(inputs, dict)
               else load_samples(inputs, shell, "Input file"))
    program, cfg = result.program, result.program.config
    q_in = _quantize_inputs(result.graph, program, samples)
    q_in = q_in.reshape((-1,) + program.input_placement.shape)
    words = [b"".join(w.to_bytes(cfg.rows, "little")
                      for w in pack_words(x, program.input_placement, cfg.rows)) for x in q_in]
    with SerialTransport(port, baud or info["baud"], timeout) as transport:
        client = Client(transport)
        client.verify(cfg, build_id(program))
        send_program(client, cfg, encode_program(program))
        log(f"Board on {port} holds build 0x{build_id(program):08X}; running {len(words)} "
            f"sample(s) ...")
        raw, cycles = run_samples(client, program.input_placement.base,
                                  program.output_placement.base, program.output_placement.words,
                                  words)
    target = program.output_placement
    q_out = np.stack([unpack_words([int.from_bytes(r[i:i + cfg.rows], "little")
                                    for i in range(0, len(r), cfg.rows)], target, cfg.rows)
                      for r in raw]).reshape((-1,) + target.shape[1:])
    return _result(result, q_out, cycles, 0.0)


def plan_model(model, *, config: "ArchConfig | None" = None, input_shapes=None,
               override_initializers=None) -> "tuple[Graph, Program]":
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
    try:
        int_graph = quantize_model(float_graph, samples)
    finally:
        quant_log.setLevel(level)
    return int_graph, lower(int_graph, config or ArchConfig())


def load_build(out_dir) -> BuildResult:
    out = Path(out_dir)
    if not (out / "program.json").exists():
        raise ModelError(f"'{out}' is not an hwonnx build folder (no program.json); run "
                         f"'hwonnx build MODEL -o {out}' first")
    import json
    return BuildResult(out, load_graph(out, "graph"), load_program(out),
                       json.loads((out / "report.json").read_text()))


def _quantize_inputs(graph: Graph, program: Program, inputs: "dict[str, np.ndarray]"):
    """The accelerator's int8 input ``[S, ...]`` from the model's inputs: the host steps
    before the accelerator (if any), then the quantization, with the golden model's
    functions."""
    node = graph.producer(program.input_value)
    value = node.inputs[0]
    feeds = {name: inputs[name].reshape((-1,) + graph.types[name].shape[1:])
             for name in graph.inputs}
    if value not in feeds:
        prefix = Graph(_upstream(graph, value), graph.inputs, (value,), graph.types,
                       graph.constants)
        feeds = evaluate(prefix, feeds)
    return quantize(feeds[value], **dict(node.attrs))


def _upstream(graph: Graph, value: str) -> "list":
    """The nodes ``value`` depends on, in graph order."""
    needed, nodes = {value}, []
    for node in reversed(graph.nodes):
        if needed & set(node.outputs):
            nodes.append(node)
            needed.update(node.inputs)
    return nodes[::-1]


def _host_outputs(graph: Graph, program: Program, q: np.ndarray) -> "dict[str, np.ndarray]":
    """The model's outputs from the accelerator's int8 output: dequantization and any host
    steps after it (a final Softmax), with the golden model's host functions."""
    return evaluate(graph, {program.output_value: q}, downstream=True)


def run_golden(build_result: BuildResult, inputs: "dict[str, np.ndarray]") -> SimResult:
    graph, program = build_result.graph, build_result.program
    q_in = _quantize_inputs(graph, program, inputs)
    q_out = evaluate(graph, {program.input_value: q_in.reshape(
        (-1,) + program.input_placement.shape[1:])}, keep_all=True,
        downstream=True)[program.output_value]
    return _result(build_result, q_out, [], 0.0)


def run_rtl_batch(build_result: BuildResult, inputs: "dict[str, np.ndarray]",
                  log=print) -> SimResult:
    from .sim import execute_rtl
    graph, program = build_result.graph, build_result.program
    q_in = _quantize_inputs(graph, program, inputs)
    q_out, run = execute_rtl(program, q_in.reshape((-1,) + program.input_placement.shape),
                             log=log)
    q_out = q_out.reshape((-1,) + program.output_placement.shape[1:])
    return _result(build_result, q_out, list(run.cycles), run.cycles_per_second)


def _result(build_result, q_out, cycles, speed) -> SimResult:
    program = build_result.program
    return SimResult(_host_outputs(build_result.graph, program, q_out), q_out, cycles,
                     predict(program.instructions, program.config).total, program.macs,
                     program.config.rows * program.config.cols, speed)


def first_difference(build_result: BuildResult, inputs: "dict[str, np.ndarray]",
                     sample: int, log=print) -> str:
    """Name the first layer whose RTL output differs from golden for ``sample``, and the
    first differing index, by running the program truncated after each layer."""
    from .sim import execute_rtl
    graph, program = build_result.graph, build_result.program
    q_in = _quantize_inputs(graph, program, inputs)[sample:sample + 1]
    shape = program.input_placement.shape
    env = evaluate(graph, {program.input_value: q_in.reshape((-1,) + shape[1:])},
                   keep_all=True, downstream=True)
    for index, layer in enumerate(program.layers):
        partial = program.truncated(index)
        got, _ = execute_rtl(partial, q_in.reshape((-1,) + shape), log=log)
        want = env[layer.output]
        got = got.reshape(want.shape)
        if not np.array_equal(got, want):
            where = tuple(int(i) for i in np.argwhere(got != want)[0])
            return (f"sample {sample}: layer '{layer.name}' ({layer.op}) output differs first "
                    f"at index {where}: RTL {int(got[where])}, golden {int(want[where])}")
    return f"sample {sample}: every layer output matches; the difference is in the host I/O"


def simulate(out_dir, inputs, *, mode: str = "rtl", log=print) -> SimResult:
    """Run a build on ``inputs``: ``name -> [S, ...]``, one array ``[S, ...]`` for a
    single-input model, or a sample file path (as ``hwonnx sim --input`` takes).

    ``mode``: ``"rtl"`` (Verilator), ``"golden"`` (the NumPy golden model) or ``"compare"``
    (both; raises :class:`MismatchError` naming the first differing layer and index).

    Raises
    ------
    UsageError
        If ``inputs`` is one array for a model of several inputs, or of another type.
    """
    from .quant import load_samples, normalize_samples

    result = out_dir if isinstance(out_dir, BuildResult) else load_build(out_dir)
    float_inputs = {name: result.graph.types[name] for name in result.graph.inputs}
    shell = Graph((), tuple(float_inputs), (), float_inputs)
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
    if mode == "golden":
        return run_golden(result, samples)
    rtl = run_rtl_batch(result, samples, log=log)
    if mode == "rtl":
        return rtl
    if mode != "compare":
        raise ValueError(f"Unknown simulation mode {mode!r}")
    golden = run_golden(result, samples)
    if not np.array_equal(rtl.int_outputs, golden.int_outputs):
        sample = int(np.argwhere((rtl.int_outputs != golden.int_outputs).reshape(
            len(rtl.int_outputs), -1).any(axis=1))[0][0])
        raise MismatchError("RTL differs from the golden model: "
                            + first_difference(result, samples, sample, log=log))
    return rtl
