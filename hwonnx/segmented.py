"""Running a segmented build (``graph.meta["segments"]``, :mod:`hwonnx.compiler.segments`):
the segments in order, with the host steps between them, on the golden model or the RTL (each
segment a separate run of the same Verilator model with its own program), mismatch
localization naming the segment, and the report's segments and host round trips.

:mod:`hwonnx.api` calls these for a build whose ``BuildResult.segments`` holds several
programs; a build of one program never comes here."""

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from .compiler.program import Program
from .compiler.segments import host_steps_before, round_trips, segment_graphs
from .compiler.timing import predict
from .golden import evaluate
from .ir import Graph

if TYPE_CHECKING:
    from .api import SimResult

__all__ = ["segmented_build", "check_segment_cycles", "run_segments", "golden_segments",
           "rtl_segments", "first_segment_difference", "golden_result", "rtl_result",
           "segmented_report", "segments_report", "segments_markdown", "segments_build_id",
           "write_segmented_build"]


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
    from .sim import execute_program

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
    from .sim import execute_program

    one = {name: inputs[name].reshape((-1,) + graph.types[name].shape[1:])[sample:sample + 1]
           for name in graph.inputs}
    env = evaluate(graph, one, keep_all=True)
    for index, program in enumerate(programs):
        feeds = {p.value: env[p.value].reshape((-1,) + program.placements[p.value].shape)
                 for p in program.inputs}
        for layer_index, layer in enumerate(program.layers):
            got, _ = execute_program(program.truncated(layer_index), feeds, [layer.output],
                                     log=log)
            want = env[layer.output]
            got = got[layer.output].reshape(want.shape)
            if not np.array_equal(got, want):
                where = tuple(int(i) for i in np.argwhere(got != want)[0])
                return (f"sample {sample}: segment {index + 1} of {len(programs)}, layer "
                        f"'{layer.name}' ({layer.op}) output differs first at index {where}: "
                        f"RTL {int(got[where])}, golden {int(want[where])}")
    return f"sample {sample}: every layer output matches; the difference is in the host I/O"


def segments_report(graph: Graph, programs: "list[Program]", baud: int) -> dict:
    """The report's ``segments``: per segment its layers, ports and predicted cycles, the host
    steps before it; per boundary the host round trip: the values read back and written,
    their bytes each way, and the time the host link would take at ``baud`` (8N1 frames of
    :mod:`hwonnx.boards.protocol`)."""
    from .boards.protocol import BITS_PER_BYTE, transfer_bytes

    before = host_steps_before(graph)
    segments = [{"index": i + 1, "host_steps_before": before[i],
                 "layers": [layer.name for layer in p.layers],
                 "inputs": [port.value for port in p.inputs],
                 "outputs": [port.value for port in p.outputs],
                 "macs": p.macs, "predicted_cycles": predict(p.expanded(), p.config).total}
                for i, p in enumerate(programs)]
    trips = []
    for trip in round_trips(programs):
        wire = sum(transfer_bytes(trip.rows, 0, w) for _, _, w in trip.read) \
            + sum(transfer_bytes(trip.rows, w, 0) for _, _, w in trip.written)
        trips.append({"after_segment": trip.after + 1, "host_steps": before[trip.after + 1],
                      "read": [{"value": v, "elements": n, "words": w} for v, n, w in trip.read],
                      "written": [{"value": v, "elements": n, "words": w}
                                  for v, n, w in trip.written],
                      "read_bytes": trip.read_bytes, "written_bytes": trip.written_bytes,
                      "link_bytes": wire, "baud": baud,
                      "link_seconds": wire * BITS_PER_BYTE / baud})
    return {"segments": segments, "round_trips": trips}


def segments_markdown(report: dict, clock_hz: int) -> "list[str]":
    """Markdown lines of :func:`segments_report` for ``report.md``."""
    lines = ["", "Segments (each a separate accelerator run; the host steps run between them):",
             "", "| segment | host steps before | layers | inputs | outputs | predicted cycles |",
             "|---|---|---|---|---|---:|"]
    lines += [f"| {s['index']} | {', '.join(s['host_steps_before']) or '-'} | "
              f"{', '.join(s['layers'])} | {', '.join(s['inputs'])} | "
              f"{', '.join(s['outputs'])} | {s['predicted_cycles']:,} |"
              for s in report["segments"]]
    lines += ["", "Host round trips (per inference):", "",
              "| after segment | host steps | read back | bytes read | bytes written | "
              "UART bytes | UART time | accelerator cycles at that time |",
              "|---:|---|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {t['after_segment']} | {', '.join(t['host_steps'])} | "
              f"{', '.join(r['value'] for r in t['read'])} | {t['read_bytes']:,} | "
              f"{t['written_bytes']:,} | {t['link_bytes']:,} | "
              f"{t['link_seconds'] * 1e3:.1f} ms at {t['baud']:,} baud | "
              f"{round(t['link_seconds'] * clock_hz):,} |"
              for t in report["round_trips"]]
    return lines


def _sim_result(build_result, outputs, int_values, segment_cycles, speed=0.0):
    from .api import SimResult

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


def segments_build_id(programs: "list[Program]") -> int:
    """The 32-bit identity of a segmented build: of its segments' identities, in order."""
    import hashlib

    from .boards.build import build_id

    digest = hashlib.sha256(b"".join(build_id(p).to_bytes(4, "little") for p in programs))
    return int.from_bytes(digest.digest()[:4], "little")


def segmented_report(programs: "list[Program]", model: str, board: str, graph: Graph) -> dict:
    """The build report of a segmented build: :func:`~hwonnx.report.build_report`'s keys over
    all segments (layers in order, each with its ``segment``; totals; the buffers' largest
    use), the ports of every segment, and ``segments`` (:func:`segments_report`)."""
    from .boards.top import DEFAULT_BAUD
    from .report import build_report, ports

    graphs = segment_graphs(graph)
    parts = [build_report(p, model, board, dict(graph.meta)) for p in programs]
    report = parts[0]
    report["layers"] = [{**layer, "segment": i + 1}
                        for i, part in enumerate(parts) for layer in part["layers"]]
    macs = sum(p.macs for p in programs)
    cycles = sum(part["total"]["predicted_cycles"] for part in parts)
    pes = programs[0].config.rows * programs[0].config.cols
    report["total"] = {"macs": macs, "predicted_cycles": cycles,
                       "utilization": macs / (cycles * pes) if cycles else 0}
    report["buffers"] = {name: {"used": max(part["buffers"][name]["used"] for part in parts),
                                "depth": entry["depth"]}
                         for name, entry in report["buffers"].items()}
    report["program"] = {key: sum(part["program"][key] for part in parts)
                         for key in report["program"]}
    from .report import placement
    report["placement"] = placement(graph)
    io = [ports(p, g) for p, g in zip(programs, graphs)]
    report["io"] = {kind: [{**entry, "segment": i + 1} for i, part in enumerate(io)
                           for entry in part[kind]] for kind in ("inputs", "outputs")}
    report.update(segments_report(graph, programs, DEFAULT_BAUD))
    return report


def write_segmented_build(folder, graph: Graph, programs: "list[Program]", report: dict,
                          verilog: bool, log=print) -> None:
    """Write a segmented simulation build into ``folder``: the segments' programs
    (:func:`~hwonnx.compiler.segments.save_segments`), the graph, the report, the Verilog
    and, last, a manifest of format 4."""
    from .compiler.folder import SEGMENTED_FORMAT, write_manifest
    from .compiler.segments import save_segments
    from .ir import save_graph
    from .report import write_report

    save_segments(programs, graph, folder)
    save_graph(graph, folder, "graph")
    write_report(report, folder)
    if verilog:
        from .sim.runner import accelerator_verilog
        (folder / "accel.v").write_text(accelerator_verilog(programs[0].config, log))
    write_manifest(folder, build_id=segments_build_id(programs), board="sim",
                   format=SEGMENTED_FORMAT)


def segmented_build(graph: Graph, programs: "list[Program]", model: str, target):
    """What :func:`hwonnx.api.build` keeps of a segmented model compiled for ``target``: the
    graph, the first program, the report and all programs; a board is refused (its program
    memory holds one program)."""
    from .errors import UsageError

    if not target.is_simulation:
        raise UsageError(f"Model '{model}' runs as {len(programs)} accelerator segments with "
                         f"host steps between them; segmented builds run in simulation only "
                         f"(--board sim): a board's program memory holds one program")
    return (graph, programs[0], segmented_report(programs, model, target.name, graph),
            tuple(programs))


def check_segment_cycles(rtl) -> None:
    """Raise :class:`~hwonnx.errors.MismatchError` naming the first segment and sample of the
    RTL result ``rtl`` whose simulated cycles differ from that segment's prediction."""
    from .errors import MismatchError

    for index, (cycles, want) in enumerate(zip(rtl.segment_cycles, rtl.segment_predicted)):
        bad = [(sample, c) for sample, c in enumerate(cycles) if c != want]
        if bad:
            raise MismatchError(f"RTL cycles differ from the prediction: segment {index + 1}, "
                                f"sample {bad[0][0]} took {bad[0][1]:,} cycles, predicted "
                                f"{want:,}")
