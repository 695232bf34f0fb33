"""Running a segmented build (``graph.meta["segments"]``, :mod:`hwonnx.compiler.segments`):
the segments in order, with the host steps between them, on the golden model or the RTL (each
segment a separate run of the same Verilator model with its own program), mismatch
localization naming the segment (its report: :mod:`hwonnx.report_segments`).

:mod:`hwonnx.run` calls these for a build whose ``BuildResult.segments`` holds several
programs; a build of one program never comes here."""

from dataclasses import replace

import numpy as np

from .compiler.paging import truncated
from .compiler.program import Program
from .compiler.segments import segment_graphs
from .compiler.timing import predict
from .errors import MismatchError
from .golden import evaluate
from .ir import Graph
from .results import SimResult

__all__ = ["check_segment_cycles", "run_segments", "golden_segments", "rtl_segments",
           "first_segment_difference", "golden_result", "rtl_result"]


def _host_graph(graph: Graph) -> Graph:
    """``graph`` without the segments' own nodes: the host's part (host steps, ``Quantize``,
    ``Dequantize``), evaluated around the segments."""
    owned = {name for segment in graph.meta["segments"] for name in segment["nodes"]}
    return replace(graph, nodes=tuple(n for n in graph.nodes if n.name not in owned))


def run_segments(graph: Graph, programs: "list[Program]", inputs: "dict[str, np.ndarray]",
                 run) -> "tuple[dict[str, np.ndarray], list]":
    """Run the model on ``inputs`` (graph input -> ``[S, ...]``): before each segment the
    host part that its inputs need (host steps, quantization), then ``run(index, program,
    q_in)`` (int8 input value -> ``[S, ...]``), which returns ``(q_out, info)`` (int8 output
    value -> ``[S, ...]``), and after the last the host part that the graph outputs need.
    Returns every value computed (by name) and each segment's ``info``."""
    host = _host_graph(graph)
    env = {name: inputs[name].reshape((-1,) + graph.types[name].shape[1:])
           for name in graph.inputs}
    infos = []
    for index, program in enumerate(programs):
        env = evaluate(host, env, keep_all=True, downstream=True)
        q_out, info = run(index, program, {p.value: env[p.value] for p in program.inputs})
        env.update({value: q.reshape((-1,) + program.placements[value].shape[1:])
                    for value, q in q_out.items()})
        infos.append(info)
    env = evaluate(host, env, keep_all=True, downstream=True)
    return env, infos


def _int_values(programs: "list[Program]", env) -> "dict[str, np.ndarray]":
    return {p.value: env[p.value] for program in programs for p in program.outputs}


def golden_segments(graph: Graph, programs: "list[Program]", inputs
                    ) -> "tuple[dict[str, np.ndarray], dict[str, np.ndarray]]":
    """The golden model: graph outputs and every segment's int8 outputs (by value)."""
    bodies = [replace(g, nodes=tuple(n for n in g.nodes
                                     if n.op not in ("Quantize", "Dequantize")))
              for g in segment_graphs(graph)]

    def run(index, program, q_in):
        values = evaluate(bodies[index], q_in, keep_all=True)
        return {p.value: values[p.value] for p in program.outputs}, None

    env, _ = run_segments(graph, programs, inputs, run)
    return {name: env[name] for name in graph.outputs}, _int_values(programs, env)


def rtl_segments(graph: Graph, programs: "list[Program]", inputs, log=print,
                 max_cycles=None):
    """The RTL: graph outputs, every segment's int8 outputs and, per segment, the simulator's
    :class:`~hwonnx.sim.RunResult`."""
    from .sim import execute_program      # the simulator loads on first use (hwonnx.sim)

    def run(index, program, q_in):
        log(f"Simulating segment {index + 1}/{len(programs)} on the RTL ...")
        placed = {v: q.reshape((-1,) + program.placements[v].shape) for v, q in q_in.items()}
        return execute_program(program, placed, log=log, max_cycles=max_cycles)

    env, runs = run_segments(graph, programs, inputs, run)
    return {name: env[name] for name in graph.outputs}, _int_values(programs, env), runs


def first_segment_difference(graph: Graph, programs: "list[Program]", inputs, sample: int,
                             log=print) -> str:
    """Name the first segment, and in it the first layer, whose RTL output differs from
    golden for ``sample``: each segment runs on the golden model's inputs, truncated after
    each of its layers."""
    from .sim import execute_program      # the simulator loads on first use (hwonnx.sim)

    one = {name: inputs[name].reshape((-1,) + graph.types[name].shape[1:])[sample:sample + 1]
           for name in graph.inputs}
    env = evaluate(graph, one, keep_all=True)
    for index, program in enumerate(programs):
        feeds = {p.value: env[p.value].reshape((-1,) + program.placements[p.value].shape)
                 for p in program.inputs}
        for layer_index, layer in enumerate(program.layers):
            got, _ = execute_program(truncated(program, layer_index), feeds, [layer.output],
                                     log=log)
            want = env[layer.output]
            got = got[layer.output].reshape(want.shape)
            if not np.array_equal(got, want):
                where = tuple(int(i) for i in np.argwhere(got != want)[0])
                return (f"sample {sample}: segment {index + 1} of {len(programs)}, layer "
                        f"'{layer.name}' ({layer.op}) output differs first at index {where}: "
                        f"RTL {int(got[where])}, golden {int(want[where])}")
    return f"sample {sample}: every layer output matches; the difference is in the host I/O"


def _sim_result(build_result, outputs, int_values, segment_cycles, speed=0.0):
    programs = list(build_result.segments)
    predicted = [predict(p.expanded(), p.config).total for p in programs]
    config = programs[0].config
    return SimResult(outputs, int_values,
                     [int(sum(c)) for c in zip(*segment_cycles)] if segment_cycles else [],
                     sum(predicted), sum(p.macs for p in programs), config.rows * config.cols,
                     speed, segment_cycles=segment_cycles, segment_predicted=predicted)


def golden_result(build_result, inputs) -> "SimResult":
    """:func:`hwonnx.api.run_golden` of a segmented build."""
    outputs, int_values = golden_segments(build_result.graph, list(build_result.segments),
                                          inputs)
    return _sim_result(build_result, outputs, int_values, [])


def rtl_result(build_result, inputs, log=print, max_cycles=None) -> "SimResult":
    """:func:`hwonnx.api.run_rtl_batch` of a segmented build: the simulation speed is over
    all segments' runs."""
    outputs, int_values, runs = rtl_segments(build_result.graph, list(build_result.segments),
                                             inputs, log, max_cycles)
    cycles = [list(run.cycles) for run in runs]
    total = sum(sum(c) for c in cycles)
    wall = sum(sum(c) / run.cycles_per_second for c, run in zip(cycles, runs)
               if run.cycles_per_second)
    steady = sum(sum(c) / run.steady_cycles_per_second for c, run in zip(cycles, runs)
                 if run.steady_cycles_per_second)
    result = _sim_result(build_result, outputs, int_values, cycles,
                         total / wall if wall else 0.0)
    result.steady_cycles_per_second = total / steady if steady else 0.0
    result.startup_seconds = sum(run.startup_seconds for run in runs)
    return result


def check_segment_cycles(rtl) -> None:
    """Raise :class:`~hwonnx.errors.MismatchError` naming the first segment and sample of the
    RTL result ``rtl`` whose simulated cycles differ from that segment's prediction."""
    for index, (cycles, want) in enumerate(zip(rtl.segment_cycles, rtl.segment_predicted)):
        bad = [(sample, c) for sample, c in enumerate(cycles) if c != want]
        if bad:
            raise MismatchError(f"RTL cycles differ from the prediction: segment {index + 1}, "
                                f"sample {bad[0][0]} took {bad[0][1]:,} cycles, predicted "
                                f"{want:,}")
