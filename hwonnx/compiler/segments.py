"""Program segments: an integer graph with host steps between accelerator parts
(``graph.meta["segments"]``, made by :func:`hwonnx.quant.segments.quantize_segments`) compiles
to one program per segment, all for one architecture (so one Verilator model or bitstream runs
them all), and a segmented build folder holds them side by side (``docs/build-folder.md``).
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..config import ArchConfig
from ..errors import ModelError
from ..ir import Graph, Node
from .artifact import load_program, save_program
from .lower import lower
from .program import Program
from .sizing import BUFFERS, needs, probe, sized

__all__ = ["SEGMENTS_FILE", "RoundTrip", "is_segmented", "segment_graphs", "lower_segments",
           "segment_folder", "save_segments", "load_segments", "round_trips"]

#: The file of a segmented build folder that lists its segments, in order.
SEGMENTS_FILE = "segments.json"


def is_segmented(graph: Graph) -> bool:
    """Whether the integer ``graph`` has host steps between accelerator segments."""
    return bool(graph.meta.get("segments"))


def segment_graphs(graph: Graph) -> "list[Graph]":
    """One integer graph per segment, as :func:`~hwonnx.compiler.lower.lower` takes it: the
    ``Quantize`` of each input the host writes (a value an earlier segment made too, which the
    host reads back and writes again unchanged), the segment's nodes and the ``Dequantize`` of
    each output the host reads."""
    by_name = {node.name: node for node in graph.nodes}
    graphs = []
    for segment in graph.meta["segments"]:
        quantizers = [Node(f"quantize_{v}", "Quantize", (v,), (q,),
                           _input_attrs(graph, q, s, z)) for v, q, s, z in segment["inputs"]]
        dequantizers = [Node(f"dequantize_{v}", "Dequantize", (q,), (v,),
                             {"scale": float(s), "zero_point": int(z)})
                        for q, v, s, z in segment["outputs"]]
        body = [by_name[name] for name in segment["nodes"]]
        graphs.append(Graph(quantizers + body + dequantizers,
                            tuple(p[0] for p in segment["inputs"]),
                            tuple(p[1] for p in segment["outputs"]), graph.types,
                            graph.constants, graph.meta))
    return graphs


def _input_attrs(graph: Graph, q: str, scale, zero_point) -> dict:
    """The attributes of the ``Quantize`` writing ``q``: the graph's own (an input's range or
    sign, :func:`hwonnx.golden.quantize`) when a ``Quantize`` writes it there, else those of
    a value an earlier segment made, read back and written again (its scale, zero point)."""
    node = graph.producer(q)
    if node is not None and node.op == "Quantize":
        return dict(node.attrs)
    return {"scale": float(scale), "zero_point": int(zero_point)}


def lower_segments(graph: Graph, config: ArchConfig, size: bool = False, fixed=(),
                   block_depth: "int | None" = None, loops: bool = True) -> "list[Program]":
    """Lower every segment of ``graph`` for one architecture: ``config`` itself or, with
    ``size``, its buffers (but ``fixed``) sized to the largest need of any segment (as
    :func:`~hwonnx.compiler.sizing.sized` does for one program)."""
    graphs = segment_graphs(graph)
    if size:
        first = [needs(lower(g, probe(config, fixed), loops)) for g in graphs]
        words = {name: max(n[name] for n in first) for name in (*BUFFERS, "ext")}
        config = sized(config, words, fixed, block_depth)
    return [lower(g, config, loops) for g in graphs]


def segment_folder(index: int) -> str:
    """The folder of segment ``index`` (from 0) in a segmented build folder."""
    return f"segment{index + 1}"


def save_segments(programs: "list[Program]", graph: Graph, folder: Path) -> None:
    """Write each program into its segment folder and :data:`SEGMENTS_FILE`: the segments in
    order, each with its folder, the host steps that run before it, and its ports."""
    folder = Path(folder)
    doc = []
    for index, (program, steps) in enumerate(zip(programs, host_steps_before(graph))):
        (folder / segment_folder(index)).mkdir()
        save_program(program, folder / segment_folder(index))
        doc.append({"folder": segment_folder(index), "host_steps_before": steps,
                    "inputs": [p.value for p in program.inputs],
                    "outputs": [p.value for p in program.outputs]})
    (folder / SEGMENTS_FILE).write_text(json.dumps({"segments": doc}, indent=1) + "\n")


def load_segments(folder: Path, graph: Graph) -> "list[Program]":
    """The programs of the segmented build folder ``folder`` whose integer graph is
    ``graph``, checked to be one architecture and to have the segments' ports.

    Raises
    ------
    ModelError
        If :data:`SEGMENTS_FILE` or a segment's program is missing or disagrees with the
        graph, naming the file.
    """
    folder = Path(folder)
    try:
        doc = json.loads((folder / SEGMENTS_FILE).read_text())["segments"]
        folders = [entry["folder"] for entry in doc]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ModelError(f"'{folder / SEGMENTS_FILE}' is not a list of segments ({error}); "
                         f"rebuild '{folder}'") from error
    segments = graph.meta.get("segments") or ()
    if folders != [segment_folder(i) for i in range(len(segments))]:
        raise ModelError(f"'{folder / SEGMENTS_FILE}' lists {len(folders)} segment(s), but "
                         f"graph.json has {len(segments)}; rebuild '{folder}'")
    programs = [load_program(folder / name) for name in folders]
    for name, program, segment in zip(folders, programs, segments):
        ports = ([p.value for p in program.inputs], [p.value for p in program.outputs])
        if ports != ([p[1] for p in segment["inputs"]], [p[0] for p in segment["outputs"]]) \
                or program.config != programs[0].config:
            raise ModelError(f"'{folder / name}' is not a consistent segment of this build: "
                             f"its ports or architecture differ from graph.json's; rebuild "
                             f"'{folder}'")
    return programs


def host_steps_before(graph: Graph) -> "list[list[str]]":
    """For each segment, the host nodes (neither ``Quantize``/``Dequantize`` nor a
    segment's node) that run after the previous segment and before it."""
    owned = {name for segment in graph.meta["segments"] for name in segment["nodes"]}
    firsts = [segment["nodes"][0] for segment in graph.meta["segments"]]
    before, current = [], []
    for node in graph.nodes:
        if node.name in firsts:
            before.append(current)
            current = []
        if node.name not in owned and node.op not in ("Quantize", "Dequantize"):
            current.append(node.name)
    return before


@dataclass(frozen=True)
class RoundTrip:
    """The host's traffic at one boundary between segments: the int8 values it reads back
    from segment ``after`` and writes into the next segment (each name, elements, activation
    words), with the bytes each way (words of ``rows`` int8 lanes, as the host link moves
    them)."""
    after: int
    read: "tuple[tuple[str, int, int], ...]"
    written: "tuple[tuple[str, int, int], ...]"
    rows: int

    @property
    def read_bytes(self) -> int:
        return sum(words for _, _, words in self.read) * self.rows

    @property
    def written_bytes(self) -> int:
        return sum(words for _, _, words in self.written) * self.rows


def round_trips(programs: "list[Program]") -> "list[RoundTrip]":
    """One :class:`RoundTrip` per boundary: every output of a segment that a later segment
    or host step needs is read back once after it, every input of the next segment is
    written before it."""
    def entry(program: Program, value: str) -> "tuple[str, int, int]":
        where = program.placements[value]
        return value, math.prod(where.shape), where.words

    return [RoundTrip(index, tuple(entry(done, p.value) for p in done.outputs),
                      tuple(entry(following, p.value) for p in following.inputs),
                      done.config.rows)
            for index, (done, following) in enumerate(zip(programs, programs[1:]))]
