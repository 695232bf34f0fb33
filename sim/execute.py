"""Run a compiled program on the RTL: pack int8 tensors into words, simulate, unpack."""

import numpy as np

from ..isa import Op
from ..compiler.layout import pack_words, unpack_words
from ..compiler.program import Program, encode_program
from ..compiler.timing import cycle_windows, predict
from ..errors import SimulationError, UsageError
from .harness import STAGE_DEPTH
from .runner import RunResult, run_rtl

__all__ = ["execute_program", "execute_rtl", "default_max_cycles"]


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


def _span(placements, memory: str = "act") -> "tuple[int, int]":
    """First word and word count of the span of ``memory`` (the activation buffer or the
    external memory) that holds every one of ``placements`` there ((0, 0) for none; the
    inputs lie side by side; outputs may have other tensors between them, which the span
    also reads)."""
    placements = [p for p in placements if p.memory == memory]
    if not placements:
        return 0, 0
    first = min(p.base for p in placements)
    return first, max(p.base + p.words for p in placements) - first


def _pack_span(feeds, sources, sample: int, span: "tuple[int, int]", memory: str,
               rows: int) -> "list[int]":
    """The words of ``span`` of ``memory`` holding ``sample``'s inputs there."""
    words = [0] * span[1]
    for value, source in sources.items():
        if source.memory == memory:
            at = source.base - span[0]
            words[at:at + source.words] = pack_words(feeds[value][sample], source, rows)
    return words


def execute_program(program: Program, feeds: "dict[str, np.ndarray]",
                    values: "list[str] | None" = None, log=print,
                    max_cycles: "int | None" = None, trace=None
                    ) -> "tuple[dict[str, np.ndarray], RunResult]":
    """Run every sample of ``feeds`` (int8 input value of the program -> ``[S, *shape]``, one
    per input) back to back on the RTL and return the int8 tensors ``values`` (default: the
    program's outputs) of each sample, by value.

    The host writes the span of words holding every input and reads the span holding every
    value (:func:`_span`). ``max_cycles``: the cycles a sample may take (default:
    :func:`default_max_cycles`); beyond them :func:`~hwonnx.sim.run_rtl` raises
    :class:`SimulationError` with the accelerator's state.

    The samples run in batches of as many as the harness stages (one simulator run each,
    announced when there are several). ``trace``: a ``.vcd`` or ``.fst`` file to dump the
    run's waveforms into, with a GTKWave save file whose markers are the layers' first cycles
    (:mod:`hwonnx.sim.trace`); the samples must then fit one batch.
    """
    cfg = program.config
    rows = cfg.rows
    sources = {port.value: program.placements[port.value] for port in program.inputs}
    values = values or [port.value for port in program.outputs]
    targets = {value: program.placements[value] for value in values}
    feeds = {value: np.asarray(feeds[value], dtype=np.int8) for value in sources}
    count = len(next(iter(feeds.values())))
    in_span, out_span = _span(sources.values()), _span(targets.values())
    inx_span, outx_span = _span(sources.values(), "ext"), _span(targets.values(), "ext")
    limit = default_max_cycles(program) if max_cycles is None else max_cycles
    per_run = max(1, STAGE_DEPTH // max(in_span[1], out_span[1], inx_span[1], outx_span[1]))
    batches = -(-count // per_run)
    if trace is not None and batches > 1:
        raise UsageError(f"--trace records one simulator run, of at most {per_run:,} samples of "
                         f"this model; trace fewer than these {count:,}")
    markers = _layer_markers(program) if trace is not None else ()
    images = {"prog": encode_program(program), **program.images}
    outputs = {value: [] for value in targets}
    cycles, total, wall, steady = [], 0, 0.0, 0.0
    for start in range(0, count, per_run):
        chunk = range(start, min(start + per_run, count))
        if batches > 1:
            which = f"{start + 1:,} to {chunk[-1] + 1:,}" if len(chunk) > 1 else f"{start + 1:,}"
            log(f"Simulating batch {start // per_run + 1}/{batches} (sample(s) {which} of "
                f"{count:,}) on the RTL ...")
        words = [w for i in chunk for w in _pack_span(feeds, sources, i, in_span, "act", rows)]
        inx = [w for i in chunk for w in _pack_span(feeds, sources, i, inx_span, "ext", rows)]
        result = run_rtl(cfg, {**images, "input": words, "inx": inx}, in_addr=in_span[0],
                         in_words=in_span[1], out_addr=out_span[0], out_words=out_span[1],
                         samples=len(chunk), max_cycles=limit, log=log, first_sample=start,
                         describe=_describer(program), ext_in=inx_span, ext_out=outx_span,
                         trace=trace, markers=markers)
        read = {"act": (result.outputs, out_span), "ext": (result.outputs_ext, outx_span)}
        for memory, (got, (_, size)) in read.items():
            if len(got) != len(chunk) * size:
                raise SimulationError(f"The simulation returned {len(got)} words of the "
                                      f"{memory} memory, expected {len(chunk) * size}")
        for i in range(len(chunk)):
            for value, target in targets.items():
                got, (base, size) = read[target.memory]
                at = i * size + target.base - base
                outputs[value].append(unpack_words(got[at:at + target.words], target, rows))
        cycles += result.cycles
        total += result.total_cycles
        wall += result.wall_seconds
        steady += result.run_seconds or result.wall_seconds
    return ({value: np.stack(arrays) for value, arrays in outputs.items()},
            RunResult([], cycles, total, wall, steady))


def _layer_markers(program: Program) -> "list[tuple[str, int]]":
    """The save file's markers of a traced run: each layer's first cycle and its window
    (:func:`hwonnx.compiler.timing.cycle_windows`)."""
    return [(f"layer '{layer.name}', cycles {first} to {end - 1}" if end > first else
             f"layer '{layer.name}', no cycle of its own", first)
            for layer, (first, end) in zip(program.layers, cycle_windows(program))]


def execute_rtl(program: Program, inputs: np.ndarray, value: "str | None" = None,
                log=print, max_cycles: "int | None" = None) -> "tuple[np.ndarray, RunResult]":
    """:func:`execute_program` for a program of one input: run every sample of ``inputs``
    (int8, ``[S, *input_shape]``) and return the int8 tensor ``value`` (default: the program's
    one output) of each sample."""
    value = value or program.output_value
    outputs, run = execute_program(program, {program.input_value: inputs}, [value], log=log,
                                   max_cycles=max_cycles)
    return outputs[value], run
