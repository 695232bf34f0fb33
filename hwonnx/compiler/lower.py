"""Lower an integer graph onto the systolic array: the layers in order, the activation buffer's
allocation, and the checks of the buffers' sizes; each layer's tiles and memory images are the
:class:`~.emitter.TileEmitter`'s (through the op's lowering, :mod:`.lowerings`), the order of
the instructions is :mod:`.loops`', the program and its encoding :mod:`.program`'s.
"""

from dataclasses import replace

from ..config import ArchConfig
from ..errors import ResourceError, UnsupportedOperatorError
from ..ir import Graph, Node
from ..ir.ops import LAYER, LAYOUT, integer_ops
from ..isa import addressable
from .alloc import ActAllocator, ActivationBufferFull
from .emitter import TileEmitter
from .layout import Placement, layout_view, natural_placement
from .paging import paged
from .program import Port, Program, mark_layers
from .replay import Lowerings
from .spill import ExtTensors, band_layer, relocated, spill_attempts
from .stream import SlotTooSmall, streamed_layers
from .taps import packable_inputs, packed_placement, packed_words

__all__ = ["ARRAY_OPS", "lower"]


#: Integer operators the accelerator computes: on the array, each lowered as a convolution over
#: its sources; ``QEltwise`` on the element-wise engine (:mod:`.eltwise`).
ARRAY_OPS = integer_ops(LAYER)
#: How much more of the activation buffer (a fraction of the high-water mark without it) a
#: packed input (:mod:`.taps`) may take.
PACKED_GROWTH = 1 / 8
#: Integer layout ops: the buffer is read in another order, no instructions.
_LAYOUT = integer_ops(LAYOUT)
def _activations(node: Node, graph: Graph) -> "list[str]":
    """The int8 activation inputs of a node (its other inputs are constants)."""
    return [v for v in node.inputs if v and v not in graph.constants]


def _image_view(graph: Graph, value: str) -> "tuple[int, ...]":
    """The shape a graph input is laid out for: its own, or the ``[1, C, H, W]`` image every
    reader takes it as through a Reshape (a channels-last export's NHWC -> NCHW change of a
    one-channel input, a relabelling: ``[1, 49, 10, 1]`` read as ``[1, 1, 49, 10]``). A
    Reshape keeps the flat order, so the host writes the input's values where the image's
    natural layout puts them and the layers read the image in order."""
    shape = graph.types[value].shape
    readers = graph.consumers(value)
    views = {graph.types[n.outputs[0]].shape for n in readers if n.op in _LAYOUT}
    if readers and len(views) == 1 and all(n.op in _LAYOUT for n in readers) \
            and value not in graph.outputs:
        (view,) = views
        if len(view) == 4 and view[0] == 1:
            return view
    return shape


def lower(graph: Graph, config: ArchConfig, loops: bool = True,
          lowerings: "Lowerings | None" = None) -> Program:
    """Compile the integer ``graph`` for ``config``; with ``loops`` off, every layer is
    stored one micro-instruction at a time (to test the walker against the explicit form).

    A graph input of few channels read by one convolution is written packed for it
    (:mod:`.taps`) when that takes little more of the activation buffer: the program is
    lowered both ways and the packed one kept if its high-water mark is at most
    :data:`PACKED_GROWTH` higher (its first layer takes fewer cycles in every case).
    With ``prog_page``, the program is paged (:func:`~.paging.paged`). ``lowerings``: how
    the lowerings of ``graph`` before ended, to fail again or take their program without
    emitting the layers again (:class:`~.replay.Lowerings`).
    """
    return paged(_lower_any(graph, config, loops, lowerings))


def _lower_any(graph: Graph, config: ArchConfig, loops: bool,
               lowerings: "Lowerings | None" = None) -> Program:
    inputs = [n.outputs[0] for n in graph.nodes if n.op == "Quantize"]
    packable = packable_inputs(graph, inputs, config.rows)
    try:
        plain = _lower(graph, config, loops, {}, lowerings=lowerings)
    except ResourceError as error:
        if config.ext_memory and isinstance(error, ActivationBufferFull):
            return _spilled(graph, config, loops, error, lowerings)
        if not packable:
            raise
        try:
            return _lower(graph, config, loops, packable, lowerings=lowerings)
        except ResourceError:
            raise error from None
    if not packable:
        return plain
    try:
        packed = _lower(graph, config, loops, packable, lowerings=lowerings)
    except ResourceError:
        return plain
    return packed if packed.words["act"] <= plain.words["act"] * (1 + PACKED_GROWTH) else plain


def _spilled(graph: Graph, config: ArchConfig, loops: bool, error: ResourceError,
             lowerings: "Lowerings | None" = None) -> Program:
    """:func:`lower` with tensors in the external memory, in the order of
    :func:`~.spill.spill_attempts` until one fits (``error``: why it does not fit without;
    after them, the last attempt's)."""
    if config.cols != config.rows:
        raise ResourceError(f"{error}; the tensors that do not fit could live in the external "
                            f"memory only with a square array (its words are {config.cols} "
                            f"bytes, activation words {config.rows})") from None
    for external in spill_attempts(graph, config):
        try:
            return _lower(graph, config, loops, {}, external, lowerings)
        except ActivationBufferFull as full:    # the last: with every candidate outside
            error = full
    raise error


def _lower(graph: Graph, config: ArchConfig, loops: bool, packed: "dict[str, Node]",
           external: "frozenset[str]" = frozenset(), lowerings: "Lowerings | None" = None
           ) -> Program:
    """:func:`lower`, the graph inputs of ``packed`` written packed for their convolution,
    the tensors ``external`` in the external memory (:mod:`.spill`); the layers whose
    weights are too many to stream whole run in parts (:mod:`.split`)."""
    try:
        return _lowered(graph, config, loops, packed, external, False, lowerings)
    except SlotTooSmall:
        return _lowered(graph, config, loops, packed, external, True, lowerings)


def _lowered(graph: Graph, config: ArchConfig, loops: bool, packed: "dict[str, Node]",
             external: "frozenset[str]", split: bool, lowerings: "Lowerings | None"
             ) -> Program:
    """:func:`_lower_once` where ``lowerings`` does not decide it: the failure of a like
    lowering before raised again, or its program checked for ``config``. With an external
    memory, where most of the lowerings of a sizing fail, the layers are first emitted
    without their tiles (``dry``), which fails as the lowering would, or not, at a fraction
    of its time (ResNet-18: four of its five lowerings fail, after 41 of 60 s)."""
    if lowerings is None:
        return _lower_once(graph, config, loops, packed, external, split)
    if not split:
        lowerings.replay(config, loops, packed, external)
    done = lowerings.program(config, loops, packed, external, split)
    if done is not None and len(done.images.get("ext", ())) <= config.ext_depth:
        program = replace(done, config=config, images=dict(done.images),
                          layers=[replace(layer) for layer in done.layers],
                          words=dict(done.words))
        _check_words(config, program.words, program.images)
        return program
    emitted: dict = {}
    try:
        if config.ext_memory:       # fails as the lowering would, without the tiles
            _lower_once(graph, config, loops, packed, external, split, emitted, dry=True,
                        shared=lowerings.emitters)
        program = _lower_once(graph, config, loops, packed, external, split, emitted,
                              shared=lowerings.emitters)
    except (ActivationBufferFull, SlotTooSmall) as error:
        if not split:
            emitter = emitted.get("emitter")
            lowerings.record(config, loops, packed, external,
                             emitter.table_count if emitter else 0, error,
                             emitted.get("streaming") if isinstance(error, SlotTooSmall)
                             else None)
        raise
    lowerings.keep(program, loops, packed, external, split)
    return program


def _lower_once(graph: Graph, config: ArchConfig, loops: bool, packed: "dict[str, Node]",
                external: "frozenset[str]", split: bool, emitted: "dict | None" = None,
                dry: bool = False, shared: "dict | None" = None) -> "Program | None":
    """:func:`_lower` with layers in parts or not (``split``); ``emitted`` (a dictionary)
    gets the ``emitter``, and the ``streaming`` that :func:`~.stream.streamed_layers` decides
    from (:class:`~.replay.Lowerings`). ``dry``: the layers emitted without their tiles
    (:attr:`~.emitter.TileEmitter.dry`) up to the choice of the streamed layers; raises
    what the lowering raises until then (every error it raises before its instructions but
    the external memory's size and the buffers' checks), else returns None. ``shared``: what
    the emitters of a sizing's lowerings share (:class:`~.emitter.TileEmitter`)."""
    quantizers = [n for n in graph.nodes if n.op == "Quantize"]
    dequantizers = [n for n in graph.nodes if n.op == "Dequantize"]
    if not quantizers or not dequantizers:
        raise ResourceError(f"The model has {len(quantizers)} input(s) and "
                            f"{len(dequantizers)} output(s) on the accelerator; it needs at "
                            f"least one of each")
    # The accelerator runs everything on int8 values; float steps before a Quantize or after
    # a Dequantize (a normalization, a final Softmax) run on the host.
    body = [n for n in graph.nodes if n.op not in ("Quantize", "Dequantize")
            and graph.types[n.outputs[0]].dtype == "int8"]
    unknown = [n for n in body if n.op not in ARRAY_OPS + _LAYOUT]
    if unknown:
        raise UnsupportedOperatorError([(n.name, n.op, "", 0) for n in unknown])

    rows = config.rows
    alloc = ActAllocator(config)
    last_use = {}
    for index, node in enumerate(body):
        for value in _activations(node, graph):
            last_use[value] = index
    for node in dequantizers:       # every output stays until the host reads it
        last_use[node.inputs[0]] = len(body)

    # The inputs side by side from word 0 (the host writes them as one span), each placed
    # before any layer runs.
    placements = {}
    ext = ExtTensors(rows, {})
    for node in quantizers:
        value, shape = node.outputs[0], graph.types[node.outputs[0]].shape
        if len(shape) not in (2, 4) or shape[0] != 1:
            raise ResourceError(f"Input '{node.inputs[0]}' has shape {shape}; the array "
                                f"takes [1, C, H, W] images or [1, K] vectors")
        if value in external:        # the host writes it into the external memory
            ext.place(value, shape)
            continue
        if value in packed:
            words = packed_words(packed[value], graph, rows)
            base = alloc.allocate(value, words, 0, f"Input '{node.inputs[0]}'")
            placements[value] = packed_placement(base, packed[value], graph, rows)
            continue
        view = _image_view(graph, value)
        words = natural_placement(0, view, rows).words
        placements[value] = natural_placement(
            alloc.allocate(value, words, 0, f"Input '{node.inputs[0]}'"), view, rows
        ).with_shape(shape)

    emitter = TileEmitter(graph, config, split, dry, shared)
    if emitted is not None:
        emitted["emitter"] = emitter
    layers = []
    before: "dict[int, list]" = {}              # LOADA before, STOREA after a layer
    after: "dict[int, list]" = {}
    owners: "dict[int, int]" = {}               # a band -> the band whose weights it reads
    def place_output(node: Node, index: int) -> Placement:
        out, shape = node.outputs[0], graph.types[node.outputs[0]].shape
        words = natural_placement(0, shape, rows).words
        base = alloc.allocate(out, words, index, f"Layer '{node.name}': its output")
        placements[out] = natural_placement(base, shape, rows)
        return placements[out]

    for index, node in enumerate(body):
        out = node.outputs[0]
        sources = _activations(node, graph)
        if out in external or any(v in ext.where for v in sources):
            if out in external:
                ext.place(out, graph.types[out].shape)
            else:
                place_output(node, index)
            layers += band_layer(emitter, node, graph, sources, placements, ext,
                                 (before, after, owners))
            alloc.release_dead(last_use, index)
            continue
        source = placements[node.inputs[0]]
        if node.op in _LAYOUT:
            placements[out] = layout_view(source, graph.types[out].shape, rows)
            alloc.alias(out, node.inputs[0])
        else:
            target = place_output(node, index)
            layers += emitter.layer(node, [placements[v] for v in sources], target)
        alloc.release_dead(last_use, index)
    if not layers:
        raise ResourceError("The model has no Conv, Gemm or MatMul layer to put on the array")
    if emitted is not None:
        emitted["streaming"] = (emitter.weight_words, [layer.wgt_words for layer in layers],
                                [layer.name for layer in layers])
    if dry:             # (plan_streaming chooses them first, before it moves a tile)
        streamed_layers(emitter.weight_words, [layer.wgt_words for layer in layers],
                        [layer.name for layer in layers], config)
        return None
    streaming = emitter.stream_weights([layer.wgt_words for layer in layers],
                                       [layer.name for layer in layers], owners)
    if streaming is not None:
        for index, words in streaming.streamed.items():
            layers[index].ext_words = words
    ext_base = len(streaming.ext) if streaming else 0
    before, after = relocated(before, ext_base), relocated(after, ext_base)
    for value in [n.outputs[0] for n in quantizers] + [n.inputs[0] for n in dequantizers]:
        if value in ext.where:      # the host reads or writes it there
            address, shape = ext.where[value]
            placements[value] = replace(natural_placement(ext_base + address, shape, rows),
                                        memory="ext")
    for index, records in (streaming.loadx if streaming else {}).items():
        before[index] = records + before.get(index, [])
    images = emitter.images()
    if streaming is not None:
        images["ext"] = streaming.ext
    words = {"wgt": streaming.words if streaming else emitter.weight_words,
             "par": streaming.par_words if streaming else emitter.param_words,
             "act": alloc.high_water}
    if config.ext_memory:
        words["ext"] = len(images.get("ext", ())) + ext.words
        words["stage_in"], words["stage_out"] = ext.stage
    _check_words(config, words, images)     # before the instructions: a refusal sooner
    instructions = emitter.finish(loops and config.walker, before, after)
    mark_layers(instructions, layers)
    program = Program(config, instructions, images, layers, placements,
                      tuple(Port(n.inputs[0], n.outputs[0]) for n in quantizers),
                      tuple(Port(n.outputs[0], n.inputs[0]) for n in dequantizers),
                      {"prog": len(instructions), **words})
    _check_words(config, program.words, images)
    return program


def _check_words(config: ArchConfig, words: "dict[str, int]", images: "dict[str, list]"
                 ) -> None:
    """Raise :class:`ResourceError` where a program of ``config`` whose buffers take
    ``words`` (:attr:`Program.words`; without ``prog``: before its instructions) and whose
    images are ``images`` needs more of a buffer or of the external memory than ``config``
    has or its instructions address."""
    streamed = len(images.get("ext", ()))
    tensors = words.get("ext", streamed) - streamed
    if tensors and words["ext"] > config.ext_depth:
        raise ResourceError(f"The tensors in the external memory take {tensors} words "
                            f"after the {streamed} of the streamed weights, "
                            f"but the {config.name} architecture has {config.ext_depth} "
                            f"(ext_depth)")
    for name in ("act", "wgt", "par", "prog"):     # the program last: it is explicit
        if name not in words:                       # where a loop's addresses overflow
            continue
        used = words[name]
        depth = getattr(config, f"{name}_depth")
        limit = addressable(name) if name != "prog" else None
        if limit is not None and used > limit:
            stream = ("; or stream the weights from an external memory (--ext-memory: the "
                      "board's own, or any on --board sim), whose two slots then take the "
                      "largest layer's weights twice"
                      if name in ("wgt", "par") and not config.ext_memory else "")
            raise ResourceError(f"The model needs {used} words of the {name} buffer, more than "
                                f"the {limit} an instruction can address; use a larger array "
                                f"(--rows/--cols: wider words, fewer of them){stream}")
        if used > depth and not (name == "prog" and config.prog_page):    # pages: any length
            raise ResourceError(f"The model needs {used} words of the {name} buffer, but the "
                                f"{config.name} architecture has {depth}; raise "
                                f"--{name}-depth or use a larger board")
