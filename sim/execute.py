"""Run a compiled program on the RTL: pack int8 tensors into words, simulate, unpack."""

import numpy as np

from ..compiler.layout import pack_words, unpack_words
from ..compiler.lower import Program, encode_program
from ..errors import SimulationError
from .harness import STAGE_DEPTH
from .runner import RunResult, run_rtl

__all__ = ["execute_rtl"]


def execute_rtl(program: Program, inputs: np.ndarray, value: "str | None" = None,
                log=print) -> "tuple[np.ndarray, RunResult]":
    """Run every sample of ``inputs`` (int8, ``[S, *input_shape]``) back to back on the RTL
    and return the int8 tensor ``value`` (default: the program output) of each sample."""
    cfg = program.config
    rows = cfg.rows
    source = program.input_placement
    target = program.placements[value or program.output_value]
    inputs = np.asarray(inputs, dtype=np.int8)
    per_run = max(1, STAGE_DEPTH // max(source.words, target.words))
    images = {"prog": encode_program(program), **program.images}
    outputs, cycles, total, wall = [], [], 0, 0.0
    for start in range(0, len(inputs), per_run):
        chunk = inputs[start:start + per_run]
        words = [w for sample in chunk for w in pack_words(sample, source, rows)]
        result = run_rtl(cfg, {**images, "input": words}, in_addr=source.base,
                         in_words=source.words, out_addr=target.base, out_words=target.words,
                         samples=len(chunk), log=log)
        if len(result.outputs) != len(chunk) * target.words:
            raise SimulationError(f"The simulation returned {len(result.outputs)} words, "
                                  f"expected {len(chunk) * target.words}")
        for i in range(len(chunk)):
            block = result.outputs[i * target.words:(i + 1) * target.words]
            outputs.append(unpack_words(block, target, rows))
        cycles += result.cycles
        total += result.total_cycles
        wall += result.wall_seconds
    return np.stack(outputs), RunResult([], cycles, total, wall)
