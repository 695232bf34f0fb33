"""Run a compiled program on the RTL: pack int8 tensors into words, simulate, unpack."""

import numpy as np

from ..isa import Op
from ..compiler.layout import pack_words, unpack_words
from ..compiler.program import Program, encode_program
from ..compiler.timing import predict
from ..errors import SimulationError
from .harness import STAGE_DEPTH
from .runner import RunResult, run_rtl

__all__ = ["execute_rtl", "default_max_cycles"]


def default_max_cycles(program: Program) -> int:
    """The cycles a sample of ``program`` may take before its simulation is stopped: twice
    the prediction plus 10,000 (the prediction is exact for a working accelerator)."""
    return min(2 * predict(program.expanded(), program.config).total + 10_000, (1 << 31) - 2)


def _describer(program: Program):
    issued = program.expanded()     # debug_dispatched counts what the dispatcher issues

    def describe(index: int) -> str:
        if not 0 <= index < len(issued):
            return "none"
        instr = issued[index]
        layer = program.layers[instr.layer].name
        walker = ", from the tile walker" if instr.looped else ""
        return f"#{index} {Op.NAMES[instr['op']]} (layer '{layer}'{walker})"
    return describe


def execute_rtl(program: Program, inputs: np.ndarray, value: "str | None" = None,
                log=print, max_cycles: "int | None" = None) -> "tuple[np.ndarray, RunResult]":
    """Run every sample of ``inputs`` (int8, ``[S, *input_shape]``) back to back on the RTL
    and return the int8 tensor ``value`` (default: the program output) of each sample.

    ``max_cycles``: the cycles a sample may take (default: :func:`default_max_cycles`);
    beyond them :func:`~hwonnx.sim.run_rtl` raises :class:`SimulationError` with the
    accelerator's state.
    """
    cfg = program.config
    rows = cfg.rows
    source = program.input_placement
    target = program.placements[value or program.output_value]
    inputs = np.asarray(inputs, dtype=np.int8)
    limit = default_max_cycles(program) if max_cycles is None else max_cycles
    per_run = max(1, STAGE_DEPTH // max(source.words, target.words))
    images = {"prog": encode_program(program), **program.images}
    outputs, cycles, total, wall, steady = [], [], 0, 0.0, 0.0
    for start in range(0, len(inputs), per_run):
        chunk = inputs[start:start + per_run]
        words = [w for sample in chunk for w in pack_words(sample, source, rows)]
        result = run_rtl(cfg, {**images, "input": words}, in_addr=source.base,
                         in_words=source.words, out_addr=target.base, out_words=target.words,
                         samples=len(chunk), max_cycles=limit, log=log, first_sample=start,
                         describe=_describer(program))
        if len(result.outputs) != len(chunk) * target.words:
            raise SimulationError(f"The simulation returned {len(result.outputs)} words, "
                                  f"expected {len(chunk) * target.words}")
        for i in range(len(chunk)):
            block = result.outputs[i * target.words:(i + 1) * target.words]
            outputs.append(unpack_words(block, target, rows))
        cycles += result.cycles
        total += result.total_cycles
        wall += result.wall_seconds
        steady += result.run_seconds or result.wall_seconds
    return np.stack(outputs), RunResult([], cycles, total, wall, steady)
