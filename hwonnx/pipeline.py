"""``hwonnx build`` as one list of named steps (:data:`BUILD_STEPS`), read top to bottom.

A build is a :class:`BuildRequest` (what the user asked, checked by :func:`build_request`
before anything is compiled) and a :class:`BuildState` that each step replaces with a new
one (``dataclasses.replace``), the way the float passes run over the graph
(:data:`hwonnx.passes.FLOAT_PIPELINE`) and FINN's ``default_build_dataflow_steps`` run over
a model:

1. ``read``: the ONNX model to a float graph (:func:`hwonnx.frontend.import_model`);
2. ``float-passes``: the float passes, then the frontend's checks of their result;
3. ``quantize``: the calibration data and the quantizer (host steps stay float);
4. ``fit-architecture``: the integer graph as the architecture computes it;
5. ``lower-and-size``: the program (a segmented model: one per segment), buffers sized;
6. ``fit-board``: a board build's fallbacks until the program fits the device;
7. ``report``: the build report;
8. ``write``: the build folder (program, graph, report, Verilog, board plan, manifest).

A build is always a tuple of programs (``BuildState.programs``): one, or a segmented model's
segments in order (``docs/architecture.md``, "Host steps and program segments").
"""

import gc
import hashlib
import json
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .boards import Board, at_clock, check_fits, get_board
from .boards import build as board_build    # through the module: a test replaces its functions
from .boards.top import uart_divisor
from .compiler.artifact import save_program
from .compiler.folder import (BUILD_NAMES, SEGMENTED_FORMAT, staged_folder,
                              verify_build_folder, write_manifest)
from .compiler.program import Program
from .compiler.segments import save_segments
from .compiler.sizing import BUFFERS
from .config import ArchConfig
from .errors import ToolchainError, UsageError
from .fitting import configure_arch, fit_board, for_architecture, lower_sized
from .frontend import ImportedModel, finish_import, import_model
from .ir import Graph, save_graph
from .passes import FLOAT_PIPELINE, run_pipeline
from .quant import load_samples, normalize_samples, quantize_model
from .quant.calibrate import DEFAULT_METHOD, check_method
from .report import programs_report, write_report
from .results import BuildResult

__all__ = ["BuildRequest", "BuildState", "BUILD_STEPS", "run_steps", "build_request", "build",
           "compile_programs", "plan_programs", "bitstream", "model_label"]


@dataclass(frozen=True)
class BuildRequest:
    """What a build was asked for, checked: the model and its calibration data as given, the
    architecture ``config``, the ``board`` (None: compile only), how the buffers are sized
    (``size``: ``"sim"``, a board's name or None, as they are; ``fixed``: buffers given by
    the user), whether a board build may choose a smaller array (``choose_array``), what
    the write step writes, and the calibration method (``calibrate``,
    :data:`hwonnx.quant.calibrate.METHODS`)."""
    model: object
    config: ArchConfig
    calib: object = None
    board: "Board | None" = None
    size: "str | None" = None
    fixed: frozenset = frozenset()
    choose_array: bool = False
    loops: bool = True
    input_shapes: object = None
    override_initializers: object = None
    verilog: bool = True
    bitstream: bool = False
    baud: "int | None" = None
    log: object = print
    calibrate: str = DEFAULT_METHOD


@dataclass(frozen=True)
class BuildState:
    """A build between two steps: each step fills in what it makes."""
    request: BuildRequest
    started: float = 0.0                        # time.monotonic() when the build started
    imported: "ImportedModel | None" = None     # read
    float_graph: "Graph | None" = None          # float-passes
    samples: object = None                      # quantize: calibration, None if not needed
    int_graph: "Graph | None" = None            # quantize, fit-architecture
    programs: "tuple[Program, ...]" = ()        # lower-and-size, fit-board
    report: "dict | None" = None                # report (write adds the bitstream's)
    folder: "Path | None" = None                # write: the staging folder it fills
    shown: "Path | None" = None                 # write: the build folder, as the user named it


# The steps -----------------------------------------------------------------------------------

def read(state: BuildState) -> BuildState:
    request, started = state.request, time.monotonic()
    imported = import_model(request.model, input_shapes=request.input_shapes,
                            override_initializers=request.override_initializers)
    return replace(state, started=started, imported=imported)


def float_passes(state: BuildState) -> BuildState:
    imported = state.imported
    graph = run_pipeline(imported.graph, FLOAT_PIPELINE, imported.context)
    return replace(state, float_graph=finish_import(imported, graph))


def quantize(state: BuildState) -> BuildState:
    """Calibration data: None is enough when the model gives every quantization parameter
    (otherwise the quantizer raises :class:`~hwonnx.errors.QuantizationError`)."""
    calib, graph, samples = state.request.calib, state.float_graph, state.samples
    if samples is None and isinstance(calib, dict):     # (plan_programs gives samples)
        samples = normalize_samples(graph, calib, "Calibration data")
    elif samples is None and calib is not None:
        samples = load_samples(calib, graph, "Calibration file")
    return replace(state, samples=samples,
                   int_graph=quantize_model(graph, samples, state.request.calibrate))


def fit_architecture(state: BuildState) -> BuildState:
    request = state.request
    return replace(state, int_graph=for_architecture(state.int_graph, request.config,
                                                     request.log))


def lower_and_size(state: BuildState) -> BuildState:
    request = state.request
    programs = lower_sized(state.int_graph, request.config, request.size, request.fixed,
                           request.loops)
    parts = f" in {len(programs)} segments" if len(programs) > 1 else ""
    request.log(f"Compiled {sum(len(p.layers) for p in programs)} layer(s), "
                f"{sum(len(p.instructions) for p in programs)} instructions, "
                f"{sum(p.macs for p in programs):,} MACs{parts} in "
                f"{time.monotonic() - state.started:.1f} s")
    return replace(state, programs=programs)


def fit_board_step(state: BuildState) -> BuildState:
    """A board's program memory holds one program: a segmented build is refused there."""
    request, programs = state.request, state.programs
    if request.board.is_simulation:
        return state
    if len(programs) > 1:
        raise UsageError(f"Model '{model_label(request.model)}' runs as {len(programs)} "
                         f"accelerator segments with host steps between them; segmented "
                         f"builds run in simulation only (--board sim): a board's program "
                         f"memory holds one program")
    return replace(state, programs=(fit_board(state.int_graph, programs[0], request.board,
                                              request.fixed, choose_array=request.choose_array,
                                              log=request.log),))


def report(state: BuildState) -> BuildState:
    request = state.request
    return replace(state, report=programs_report(state.programs, model_label(request.model),
                                                 request.board.name, state.int_graph))


def write(state: BuildState) -> BuildState:
    """Write the build into ``state.folder``, the manifest last: a segmented build as a
    folder of format 4 (:mod:`hwonnx.compiler.segments`), always for the simulation."""
    request, folder, programs = state.request, state.folder, state.programs
    target, report_ = request.board, state.report
    if len(programs) > 1:
        save_segments(list(programs), state.int_graph, folder)
    else:
        save_program(programs[0], folder)
    save_graph(state.int_graph, folder, "graph")
    write_report(report_, folder)
    if request.verilog:
        # the simulator's modules load on first use (hwonnx.sim)
        from .sim.runner import accelerator_verilog
        (folder / "accel.v").write_text(accelerator_verilog(programs[0].config, request.log))
    if len(programs) > 1:
        write_manifest(folder, build_id=_segments_build_id(programs), board="sim",
                       format=SEGMENTED_FORMAT)
        return state
    if not target.is_simulation:
        board_build.write_board_plan(target, programs[0], folder, log=request.log,
                                     shown=state.shown,
                                     **({"baud": request.baud} if request.baud else {}))
        if request.bitstream:
            report_ = {**report_, "bitstream": board_build.build_bitstream(
                target, folder, log=request.log, shown=state.shown)}
            write_report(report_, folder)
    write_manifest(folder, build_id=board_build.build_id(programs[0]), board=target.name)
    return replace(state, report=report_)


def _segments_build_id(programs: "tuple[Program, ...]") -> int:
    """The 32-bit identity of a segmented build: of its segments' identities, in order."""
    digest = hashlib.sha256(b"".join(board_build.build_id(p).to_bytes(4, "little")
                                     for p in programs))
    return int.from_bytes(digest.digest()[:4], "little")


#: ``hwonnx build``, step by step.
BUILD_STEPS = (("read", read), ("float-passes", float_passes), ("quantize", quantize),
               ("fit-architecture", fit_architecture), ("lower-and-size", lower_and_size),
               ("fit-board", fit_board_step), ("report", report), ("write", write))


def run_steps(state: BuildState, names: "tuple[str, ...]") -> BuildState:
    """``state`` after the steps of :data:`BUILD_STEPS` named ``names``, in their order (with
    few garbage collections: :func:`_rare_collections`)."""
    with _rare_collections():
        for name, step in BUILD_STEPS:
            if name in names:
                state = step(state)
    return state


#: The collector's thresholds during a build (:func:`gc.set_threshold`).
BUILD_GC_THRESHOLDS = (100_000, 50, 100)


@contextmanager
def _rare_collections():
    """Collect garbage rarely: a build makes millions of small objects that live until its
    end (the tiles of a lowering), and with the default thresholds each of its ~50 full
    collections traverses all of them (ResNet-18 with --ext-memory: 63 of 143 s CPU in the
    collector; with :data:`BUILD_GC_THRESHOLDS` 8 s, peak memory 5.4 GB instead of 4.8).
    The thresholds as they were afterwards."""
    thresholds = gc.get_threshold()
    gc.set_threshold(*BUILD_GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


# The build and its entry points --------------------------------------------------------------

def build(model, out_dir, *, board: str = "sim", calib=None, config: "ArchConfig | None" = None,
          rows: "int | None" = None, cols: "int | None" = None, input_shapes=None,
          override_initializers=None, ext_memory: "str | None" = None,
          verilog: bool = True, bitstream: bool = False, baud: "int | None" = None,
          clock_hz: "int | None" = None, log=print, calibrate: str = DEFAULT_METHOD,
          **depths: int) -> BuildResult:
    """Compile ``model`` for ``board`` and write the build folder ``out_dir``: Verilog, program
    and memory images, architecture config (JSON), integer graph and report. ``rows``,
    ``cols``, ``<buffer>_depth`` (``stage_in_depth`` too), ``lut_tables`` and ``post_lanes``
    keywords override the board's default configuration; ``ext_memory`` adds an external memory
    (:data:`hwonnx.memories.MEMORIES`) from which the weights that do not fit stream;
    ``baud`` sets a board build's UART rate (default 115,200: ``hwonnx run`` loads an external
    memory's image over it); ``clock_hz`` a board build's clock, made by its PLL (the fastest
    it makes of at most that: :func:`hwonnx.boards.at_clock`); ``calibrate`` the calibration
    method
    (:data:`hwonnx.quant.calibrate.METHODS`). With ``out_dir`` None nothing is written (no
    ``write`` step)."""
    request = build_request(model, out_dir, board=board, calib=calib, config=config, rows=rows,
                            cols=cols, input_shapes=input_shapes,
                            override_initializers=override_initializers,
                            ext_memory=ext_memory, verilog=verilog, bitstream=bitstream,
                            baud=baud, clock_hz=clock_hz, log=log, calibrate=calibrate,
                            **depths)
    names = tuple(name for name, _ in BUILD_STEPS)
    if out_dir is None:
        state = run_steps(BuildState(request), names[:-1])
    else:
        out = Path(out_dir)
        # Everything is written into a temporary folder that replaces ``out`` only when whole.
        with staged_folder(out) as staging:
            state = run_steps(BuildState(request, folder=staging, shown=out), names)
        log(f"Build written to {out}/ (report.md: {state.report['total']['predicted_cycles']:,} "
            f"predicted cycles per inference, {state.report['total']['utilization']:.1%} "
            f"utilization)")
    programs = state.programs
    return BuildResult(None if out_dir is None else Path(out_dir), state.int_graph,
                       programs[0], state.report, programs if len(programs) > 1 else ())


def build_request(model, out_dir, *, board: str = "sim", calib=None,
                  config: "ArchConfig | None" = None, rows: "int | None" = None,
                  cols: "int | None" = None, input_shapes=None, override_initializers=None,
                  ext_memory: "str | None" = None, verilog: bool = True,
                  bitstream: bool = False, baud: "int | None" = None,
                  clock_hz: "int | None" = None, log=print,
                  calibrate: str = DEFAULT_METHOD, **depths: int) -> BuildRequest:
    """The options of :func:`build`, checked before anything is compiled or written."""
    stages = ("stage_in", "stage_out")      # the buffers but the tables: <name>_depth
    unknown = set(depths) - {f"{b}_depth" for b in (*BUFFERS[:-1], *stages)} \
        - {"lut_tables", "post_lanes"}
    if unknown:
        raise TypeError(f"build() got unexpected keyword argument(s) {sorted(unknown)}")
    target = get_board(board)
    if clock_hz is not None:
        own_hz, target = target.clock_hz, at_clock(target, clock_hz)
        if ext_memory is not None:
            raise UsageError(f"--clock with --ext-memory {ext_memory}: the memory's timing "
                             f"(hwonnx/memories.py) is reckoned in cycles of the board's own "
                             f"{own_hz / 1e6:g} MHz clock; build without one of them")
        log(f"Clock: {target.clock_hz / 1e6:g} MHz from the {board} PLL")
    check_method(calibrate)
    # The board's default depths are sized to the model; a config given whole is kept.
    size = None if config else ("sim" if target.is_simulation else target.name)
    array_free = config is None and rows is None and cols is None
    fixed = frozenset(name for name in (*BUFFERS, *stages) if f"{name}_depth" in depths
                      or (name == "lut" and "lut_tables" in depths))
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
        uart_divisor(target.clock_hz, baud)        # refused before any compilation
    if bitstream and target.is_simulation:
        raise UsageError("--bitstream needs a board: the 'sim' target has no bitstream")
    if bitstream and target.family not in board_build.YOWASP_TOOLS:
        raise ToolchainError(f"Board '{board}' needs {target.family_info.toolchain} to "
                             f"build a bitstream; build without --bitstream for its "
                             f"complete project")
    return BuildRequest(model, config, calib, target, size, fixed, array_free,
                        input_shapes=input_shapes, override_initializers=override_initializers,
                        verilog=verilog, bitstream=bitstream, baud=baud, log=log,
                        calibrate=calibrate)


def compile_programs(model, calib, *, config: ArchConfig, input_shapes=None,
                     override_initializers=None, log=print, size: "str | None" = None,
                     fixed=(), calibrate: str = DEFAULT_METHOD
                     ) -> "tuple[Graph, tuple[Program, ...]]":
    """The steps from ``read`` to ``lower-and-size``, in memory (see
    :func:`hwonnx.api.compile_model`): the integer graph and its programs."""
    request = BuildRequest(model, config, calib, size=size, fixed=frozenset(fixed),
                           input_shapes=input_shapes,
                           override_initializers=override_initializers, log=log,
                           calibrate=check_method(calibrate))
    state = run_steps(BuildState(request), ("read", "float-passes", "quantize",
                                            "fit-architecture", "lower-and-size"))
    return state.int_graph, state.programs


def plan_programs(model, *, config: "ArchConfig | None" = None, input_shapes=None,
                  override_initializers=None, loops: bool = True, size: "str | None" = None
                  ) -> "tuple[Graph, tuple[Program, ...]]":
    """:func:`compile_programs` without calibration data (see :func:`hwonnx.api.plan_model`):
    ``model`` may be a float graph already read; two seeded random samples stand in for the
    calibration data, and what the quantizer says of their ranges is not logged."""
    request = BuildRequest(model, config or ArchConfig(), size=size, loops=loops,
                           input_shapes=input_shapes,
                           override_initializers=override_initializers,
                           log=lambda message: None)
    state = BuildState(request)
    if isinstance(model, Graph):
        state = replace(state, float_graph=model)
    else:
        state = run_steps(state, ("read", "float-passes"))
    rng = np.random.default_rng(0)
    graph = state.float_graph
    samples = {name: rng.standard_normal((2,) + graph.types[name].shape).astype(np.float32)
               for name in graph.inputs}
    quant_log = logging.getLogger("hwonnx.quant")
    level = quant_log.level
    quant_log.setLevel(logging.ERROR)
    try:
        state = run_steps(replace(state, samples=samples), ("quantize", "fit-architecture"))
    finally:
        quant_log.setLevel(level)
    state = run_steps(state, ("lower-and-size",))
    return state.int_graph, state.programs


def bitstream(out_dir, log=print) -> dict:
    """Build the bitstream of a board build folder (``hwonnx bitstream OUT``): the build is
    checked (:func:`~hwonnx.compiler.folder.verify_build_folder`), copied into a temporary
    folder where the bitstream is built, and the copy with its new manifest replaces the
    folder; the report gets the bitstream's results as with ``build(..., bitstream=True)``."""
    out = Path(out_dir)
    manifest = {}

    def check(folder):
        manifest.update(verify_build_folder(folder))
        if "board/hwonnx_board.json" not in manifest["files"]:
            raise UsageError(f"'{out_dir}' holds no board build; run 'hwonnx build MODEL "
                             f"--board B -o {out_dir}' first")

    with staged_folder(out, copy=True, check=check) as staging:
        listed = manifest["files"]
        board = board_build.folder_board(staging)
        result = board_build.build_bitstream(board, staging, log=log, shown=out)
        report_ = json.loads((staging / "report.json").read_text())
        report_["bitstream"] = result
        write_report(report_, staging)
        # The user's own files in the folder (outputs of 'hwonnx sim') stay unlisted.
        write_manifest(staging, build_id=int(manifest["build_id"], 16), board=board.name,
                       only=lambda rel: rel in listed or rel.split("/")[0] in BUILD_NAMES)
    return result


def model_label(model) -> str:
    """How reports name ``model``: its path, or for a ``ModelProto`` given in memory its
    graph's name (not the whole message)."""
    if isinstance(model, (str, os.PathLike)):
        return str(model)
    name = getattr(getattr(model, "graph", None), "name", "")
    return f"in-memory model (graph '{name}')" if name else "in-memory model"
