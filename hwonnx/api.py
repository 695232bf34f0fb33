"""The Python API: the CLI is a thin shell over these functions. A build is the list of steps
of :mod:`hwonnx.pipeline`; running one is :mod:`hwonnx.run`; their results are
:mod:`hwonnx.results`."""

# The names this module re-exports are imported from it by the CLI, the tests and bench/
# (``quantize_inputs``: bench/bench_simspeed.py): ``noqa: F401``.
from .compiler.program import Program
from .compiler.timing import predict  # noqa: F401
from .config import ArchConfig
from .fitting import FALLBACK_ARRAYS, configure_arch  # noqa: F401
from .ir import Graph
from .pipeline import bitstream, build, compile_programs, model_label, plan_programs  # noqa: F401
from .results import BuildResult, SimResult  # noqa: F401
from .run import (GOLDEN_BLOCK_VALUES, MAX_CYCLES_LIMIT, first_difference,  # noqa: F401
                  load_build, quantize_inputs, run_board, run_golden, run_rtl_batch, simulate)

__all__ = ["BuildResult", "SimResult", "bitstream", "build", "compile_model", "configure_arch",
           "load_build", "plan_model", "run_board", "run_golden", "run_rtl_batch", "simulate"]


def compile_model(model, calib, *, config: ArchConfig, input_shapes=None,
                  override_initializers=None, log=print, size: "str | None" = None,
                  fixed=(), calibrate: str = "minmax"
                  ) -> "tuple[Graph, Program | list[Program]]":
    """Frontend, quantizer and compiler, in memory (the build's steps from ``read`` to
    ``lower-and-size``, :func:`hwonnx.pipeline.compile_programs`). ``calib`` (samples or a
    sample file) may be None for a pre-quantized model that gives every quantization
    parameter; otherwise :func:`~hwonnx.quant.quantize_graph` raises
    :class:`QuantizationError`. Host steps at the start and end of the graph stay float
    (:func:`~hwonnx.quant.quantize_model`); ``calibrate`` is the calibration method
    (:data:`hwonnx.quant.calibrate.METHODS`).

    ``size`` ``"sim"`` or a board's name sizes the buffers not named in ``fixed`` to the model
    (:mod:`hwonnx.compiler.sizing`); None keeps ``config`` as it is. For a model with host
    steps between accelerator segments (``graph.meta["segments"]``) the second item is the
    list of the segments' programs, all for one architecture."""
    graph, programs = compile_programs(model, calib, config=config, input_shapes=input_shapes,
                                       override_initializers=override_initializers, log=log,
                                       size=size, fixed=fixed, calibrate=calibrate)
    return graph, _one_or_list(programs)


def plan_model(model, *, config: "ArchConfig | None" = None, input_shapes=None,
               override_initializers=None, loops: bool = True, size: "str | None" = None
               ) -> "tuple[Graph, Program | list[Program]]":
    """Compile ``model`` (a model, or a float graph :func:`~hwonnx.frontend.load_model`
    made) in memory without calibration data: placement, tiling and cycle prediction depend
    only on shapes and weights, not on activation ranges, so two seeded random samples stand
    in for the calibration data (any will do that are not constant, which is refused), and
    what the quantizer says of their ranges is not logged
    (:func:`hwonnx.pipeline.plan_programs`). The second item as :func:`compile_model`'s."""
    graph, programs = plan_programs(model, config=config, input_shapes=input_shapes,
                                    override_initializers=override_initializers, loops=loops,
                                    size=size)
    return graph, _one_or_list(programs)


def _one_or_list(programs: "tuple[Program, ...]") -> "Program | list[Program]":
    """These two functions' return type of old: the program, or a segmented model's list."""
    return programs[0] if len(programs) == 1 else list(programs)
