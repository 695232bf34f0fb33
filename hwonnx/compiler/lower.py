"""Lower an integer graph onto the systolic array: tiling, buffer allocation and memory images;
the order of the instructions is :mod:`.loops`', the program and its encoding :mod:`.program`'s.
"""

import hashlib
from dataclasses import replace

import numpy as np

from ..config import ArchConfig
from ..errors import ResourceError, UnsupportedOperatorError
from ..golden.ops import INT32_MAX, INT32_MIN, accumulate_bound
from ..hdl.layouts import ParamLayout
from ..ir import Graph, Node
from ..ir.ops import LAYER, LAYOUT, integer_ops
from ..isa import MAX_LUT_TABLES, Op, addressable
from . import depthwise, eltwise, tiling
from .alloc import ActAllocator, ActivationBufferFull
from .layout import Placement, natural_placement
from .loops import LayerTiles, Tile, compress, schedule
from .paging import paged
from .program import Instr, LayerPlan, Port, Program, mark_layers
from .specs import _LayerSpec, _layer_spec, _parts
from .spill import ExtTensors, band_layer, spill_attempts
from .split import concat_parts, part_spec, part_target, weight_parts
from .stream import SlotTooSmall, plan_streaming
from .taps import packable_inputs, packed_placement, packed_words
from .weights import layer_wpack, pack_tile, weight_bits

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


def lower(graph: Graph, config: ArchConfig, loops: bool = True) -> Program:
    """Compile the integer ``graph`` for ``config``; with ``loops`` off, every layer is
    stored one micro-instruction at a time (to test the walker against the explicit form).

    A graph input of few channels read by one convolution is written packed for it
    (:mod:`.taps`) when that takes little more of the activation buffer: the program is
    lowered both ways and the packed one kept if its high-water mark is at most
    :data:`PACKED_GROWTH` higher (its first layer takes fewer cycles in every case).
    With ``prog_page``, the program is paged (:func:`~.paging.paged`)."""
    return paged(_lower_any(graph, config, loops))


def _lower_any(graph: Graph, config: ArchConfig, loops: bool) -> Program:
    inputs = [n.outputs[0] for n in graph.nodes if n.op == "Quantize"]
    packable = packable_inputs(graph, inputs, config.rows)
    try:
        plain = _lower(graph, config, loops, {})
    except ResourceError as error:
        if config.ext_memory and isinstance(error, ActivationBufferFull):
            return _spilled(graph, config, loops, error)
        if not packable:
            raise
        try:
            return _lower(graph, config, loops, packable)
        except ResourceError:
            raise error from None
    if not packable:
        return plain
    try:
        packed = _lower(graph, config, loops, packable)
    except ResourceError:
        return plain
    return packed if packed.words["act"] <= plain.words["act"] * (1 + PACKED_GROWTH) else plain


def _spilled(graph: Graph, config: ArchConfig, loops: bool, error: ResourceError) -> Program:
    """:func:`lower` with tensors in the external memory, in the order of
    :func:`~.spill.spill_attempts` until one fits (``error``: why it does not fit without;
    after them, the last attempt's)."""
    if config.cols != config.rows:
        raise ResourceError(f"{error}; the tensors that do not fit could live in the external "
                            f"memory only with a square array (its words are {config.cols} "
                            f"bytes, activation words {config.rows})") from None
    for external in spill_attempts(graph, config):
        try:
            return _lower(graph, config, loops, {}, external)
        except ActivationBufferFull as full:    # the last: with every candidate outside
            error = full
    raise error


def _lower(graph: Graph, config: ArchConfig, loops: bool, packed: "dict[str, Node]",
           external: "frozenset[str]" = frozenset()) -> Program:
    """:func:`lower`, the graph inputs of ``packed`` written packed for their convolution,
    the tensors ``external`` in the external memory (:mod:`.spill`); the layers whose
    weights are too many to stream whole run in parts (:mod:`.split`)."""
    try:
        return _lower_once(graph, config, loops, packed, external, split=False)
    except SlotTooSmall:
        return _lower_once(graph, config, loops, packed, external, split=True)


def _lower_once(graph: Graph, config: ArchConfig, loops: bool, packed: "dict[str, Node]",
                external: "frozenset[str]", split: bool) -> Program:
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

    builder = _Builder(graph, config, split)
    layers = []
    before: "dict[int, list[dict]]" = {}        # LOADA before, STOREA after a layer
    after: "dict[int, list[dict]]" = {}
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
            layers += band_layer(builder, node, graph, sources, placements, ext,
                                 (before, after, owners))
            alloc.release_dead(last_use, index)
            continue
        source = placements[node.inputs[0]]
        if node.op in _LAYOUT:
            placements[out] = source.with_shape(graph.types[out].shape)
            alloc.alias(out, node.inputs[0])
        else:
            target = place_output(node, index)
            layers += builder.layer(node, [placements[v] for v in sources], target)
        alloc.release_dead(last_use, index)
    if not layers:
        raise ResourceError("The model has no Conv, Gemm or MatMul layer to put on the array")
    streaming = plan_streaming(builder.wgt, builder.par, [layer.wgt_words for layer in layers],
                               builder.layer_tiles, [layer.name for layer in layers], config,
                               owners)
    if streaming is not None:
        builder.wgt, builder.par = streaming.wgt, streaming.par
        for index, words in streaming.streamed.items():
            layers[index].ext_words = words
    ext_base = len(streaming.ext) if streaming else 0
    ext.relocate(ext_base)
    for value in [n.outputs[0] for n in quantizers] + [n.inputs[0] for n in dequantizers]:
        if value in ext.where:      # the host reads or writes it there
            address, shape = ext.where[value]
            placements[value] = replace(natural_placement(ext_base + address, shape, rows),
                                        memory="ext")
    for index, records in (streaming.loadx if streaming else {}).items():
        before[index] = records + before.get(index, [])
    instructions = builder.finish(loops and config.walker, before, after)
    mark_layers(instructions, layers)
    images = builder.images()
    if streaming is not None:
        images["ext"] = streaming.ext
    program = Program(config, instructions, images, layers, placements,
                      tuple(Port(n.inputs[0], n.outputs[0]) for n in quantizers),
                      tuple(Port(n.outputs[0], n.inputs[0]) for n in dequantizers))
    program.words = {"prog": len(instructions),
                     "wgt": streaming.words if streaming else len(builder.wgt),
                     "par": streaming.par_words if streaming else len(builder.par),
                     "act": alloc.high_water}
    if config.ext_memory:
        program.words["ext"] = len(images.get("ext", ())) + ext.words
        program.words["stage_in"], program.words["stage_out"] = ext.stage
    if ext.words and program.words["ext"] > config.ext_depth:
        raise ResourceError(f"The tensors in the external memory take {ext.words} words "
                            f"after the {len(images.get('ext', ()))} of the streamed weights, "
                            f"but the {config.name} architecture has {config.ext_depth} "
                            f"(ext_depth)")
    for name in ("act", "wgt", "par", "prog"):     # the program last: it is explicit
        used = program.words[name]                  # where a loop's addresses overflow
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
    return program


class _Builder:
    """Accumulates tiles, instructions and memory images layer by layer."""

    def __init__(self, graph: Graph, config: ArchConfig, split: bool = False):
        self.graph, self.config, self.split = graph, config, split
        self.param_layout = ParamLayout(config)
        self.layer_tiles: "list[LayerTiles]" = []
        self.tiles: "list[Tile]" = []          # of the layer being emitted
        self.wgt: "list[int]" = []
        self.par: "list[int]" = []
        self.tables: "list[tuple[int, ...]]" = []     # activation tables, 256 int8 each
        self.output_tiles = 0
        self.layer_count = 0
        self.wpack = 0                                # of the layer being emitted
        # The bands of a layer (spill.py) emit the same tiles and parameters again: packed
        # once (Amaranth's Layout.const takes about 2 ms a parameter word), and the tile
        # cache bounded to the latest _TILE_CACHE tiles.
        self._param_words: "dict[tuple, int]" = {}
        self._tiles: "dict[tuple, list[int]]" = {}
        # and a layer's weight tiles whole (:meth:`_weight_tiles`), the latest up to
        # _TILE_CACHE tiles' words
        self._layers: "dict[tuple, tuple[dict, dict, list[int]]]" = {}
        self._layer_words = 0

    def layer(self, node: Node, sources: "list[Placement]", target: Placement
              ) -> "list[LayerPlan]":
        """Emit the tiles of one array layer, in parts (:meth:`layer_parts`; the plans'
        ``wgt_words`` are set). Every layer is a convolution over one or more sources: a K
        tile reads one channel block of one source at one kernel tap, so a residual Add is a
        1x1 convolution over both inputs, and pooling a depthwise convolution with weights of
        one; depthwise layers may stream instead (a K tile is then a kernel row:
        :mod:`.depthwise`)."""
        return [emit() for emit in self.layer_parts(node, sources, target)]

    def layer_parts(self, node: Node, sources: "list[Placement]", target: Placement):
        """A function per part of the layer (:meth:`layer`) that emits it and returns its
        plan: the phases of a transposed convolution or the pieces of a height/width
        concatenation (:func:`~.specs._parts`), the sources of a channel concatenation
        (:func:`~.split.concat_parts`), groups of output channels whose weights stream on
        their own where ``split`` is on (:func:`~.split.weight_parts`), else the layer whole."""
        def counted(emit):
            def run() -> LayerPlan:
                start = len(self.wgt)
                plan = emit()
                plan.wgt_words = len(self.wgt) - start
                return plan
            return run

        if node.op == "QEltwise":
            return [counted(lambda: eltwise.emit_eltwise(self, node, sources, target))]
        rows = self.config.rows
        several = _parts(node, sources, self.graph, rows)
        if several:            # several layers write the output, each its own pixels
            return [counted(lambda name=name, spec=spec: self.emit(
                        node, spec, target, f"{node.name} [{name}]"))
                    for name, spec in several]
        spec = _layer_spec(node, sources, self.graph, rows)
        parts = weight_parts(spec, self.config) if self.split else [(0, spec.phys.shape[0])]
        if node.op == "QConcat" and target.is_natural_image(rows):
            parts = concat_parts(spec, rows) or parts
        if len(parts) == 1:
            return [counted(lambda: self.emit(node, spec, target))]
        return [counted(lambda c0=c0, c1=c1: self.emit(
                    node, part_spec(spec, c0, c1), part_target(target, c0, rows),
                    f"{node.name} [channels {c0}-{c1 - 1}]"))
                for c0, c1 in parts]

    def emit(self, node: Node, spec: "_LayerSpec", target: Placement,
             name: "str | None" = None) -> LayerPlan:
        """Emit the tiles of the layer ``spec`` (of ``node``) writing ``target``."""
        rows = self.config.rows
        n_out, kh, kw = spec.phys.shape[:3]
        bound = np.abs(spec.bias).astype(np.int64)
        for source, offset in zip(spec.sources, spec.offsets):    # each with its zero point
            taps = spec.phys[..., offset:offset + source.cb * rows].reshape(n_out, -1)
            bound = bound + accumulate_bound(taps, source.zp)
        if bound.max(initial=0) > INT32_MAX:
            raise ResourceError(f"Layer '{node.name}': output channel {int(bound.argmax())} "
                                f"could overflow the int32 accumulator (sum |w| x |x - zero "
                                f"point| + |bias| up to {int(bound.max())}); split the layer "
                                f"into layers of fewer inputs whose outputs an Add sums")
        # The hardware adds raw activations; the zero points move into the bias. (A maximum
        # is one raw activation, so its zero point moves in once.)
        folded = spec.bias.copy()
        for source, offset in zip(spec.sources, spec.offsets):
            width = source.cb * rows
            taps = spec.phys[..., offset:offset + width].reshape(n_out, -1)
            folded -= source.zp * (taps.max(axis=1) if spec.pool_max else taps.sum(axis=1))
        if folded.min(initial=0) < INT32_MIN or folded.max(initial=0) > INT32_MAX:
            raise ResourceError(f"Layer '{node.name}': the bias with the input zero point "
                                f"folded in does not fit int32")
        if spec.rounding == "ort" and not self.config.ort_rounding:
            raise ResourceError(f"Layer '{node.name}' rounds as onnxruntime does, but the "
                                f"{self.config.name} architecture has no ort_rounding unit")
        lut = self.table_index(node, spec.table)
        plan = LayerPlan(name or node.name, node.op, node.outputs[0], int(spec.macs))
        self.tiles, self.wpack = [], layer_wpack(spec.phys)
        plan.wgt_bits = weight_bits(self.wpack)
        if depthwise.streams(spec, self.config):
            nest = depthwise.emit_depthwise(self, spec, folded, target, lut)
        else:
            nest = self._emit(spec, folded, target, lut)
        self.layer_tiles.append(LayerTiles(self.tiles, nest))
        plan.tiles = len(self.tiles)
        self.layer_count += 1
        return plan

    def weight_tile(self, tile: np.ndarray) -> int:
        """Store a ``rows x cols`` weight tile of the layer being emitted; its address."""
        address = len(self.wgt)
        key = (self.wpack, tile.shape, tile.dtype.str, tile.tobytes())
        words = self._tiles.get(key)
        if words is None:
            words = self._tiles[key] = pack_tile(tile, self.wpack)
            if len(self._tiles) > _TILE_CACHE:
                del self._tiles[next(iter(self._tiles))]
        self.wgt.extend(words)
        return address

    def _weight_tiles(self, spec: "_LayerSpec", n_tiles: list) -> "tuple[dict, dict]":
        """Store the weight tiles of the layer ``spec`` for its N tiles ``n_tiles``; returns
        each N tile's K tiles ``(source, ky, kx, block)`` and each tile's address.

        K tiles whose weights are all zero for these channels (grouped and depthwise
        convolutions, the other input of an Add) are skipped; one is kept so that the
        accumulators are initialized. A dense layer keeps them all, so that its tiles stay
        one nest (a weight block that happens to be zero costs a tile, not a program of one
        instruction per tile)."""
        rows, cols = self.config.rows, self.config.cols
        kh, kw = spec.phys.shape[1:3]
        key = (hashlib.blake2b(spec.phys.tobytes()).digest(), spec.phys.shape,
               spec.phys.dtype.str, tuple(spec.offsets),
               tuple(source.cb for source in spec.sources), spec.dense, tuple(n_tiles),
               self.wpack)
        start = len(self.wgt)
        if key in self._layers:             # a band of a layer emitted before: the same tiles
            k_tiles, relative, words = self._layers[key]
            self.wgt.extend(words)
            return ({n0: list(k) for n0, k in k_tiles.items()},
                    {tile: start + offset for tile, offset in relative.items()})
        k_tiles, tile_addr = {}, {}
        last = len(spec.sources) - 1
        for n0, nt in n_tiles:
            kept = []
            for index, (source, offset) in enumerate(zip(spec.sources, spec.offsets)):
                blocks = spec.phys[n0:n0 + nt, :, :, offset:offset + source.cb * rows]
                if spec.dense:
                    nonzero = np.ones((kh, kw, source.cb), dtype=bool)
                else:       # found at once: a depthwise layer has channels^2 blocks
                    nonzero = blocks.reshape(nt, kh, kw, source.cb, rows).any(axis=(0, 4))
                if index == last and not kept and not nonzero.any():
                    nonzero[-1, -1, -1] = True
                kept += [(index, ky, kx, cb) for ky, kx, cb in np.argwhere(nonzero).tolist()]
            k_tiles[n0] = kept
            for index, ky, kx, cb in kept:
                offset = spec.offsets[index]
                block = spec.phys[n0:n0 + nt, ky, kx, offset + cb * rows:
                                  offset + (cb + 1) * rows]
                padded = np.zeros((rows, cols), dtype=np.int64)
                padded[:, :nt] = block.T
                tile_addr[n0, index, ky, kx, cb] = self.weight_tile(padded)
        words = self.wgt[start:]
        self._layers[key] = ({n0: list(k) for n0, k in k_tiles.items()},
                             {tile: a - start for tile, a in tile_addr.items()}, words)
        self._layer_words += len(words)
        while self._layer_words > _TILE_CACHE * cols and len(self._layers) > 1:
            self._layer_words -= len(self._layers.pop(next(iter(self._layers)))[2])
        return k_tiles, tile_addr

    def table_index(self, node: Node, table: "tuple[int, ...] | None") -> int:
        """The POST ``lut`` field of a layer's activation ``table`` (0: none), stored once."""
        if table is None:
            return 0
        if table not in self.tables:
            self.tables.append(table)
        lut = self.tables.index(table) + 1
        if lut > self.config.lut_tables:
            advice = ("raise --lut-tables or use a board whose array has more"
                      if self.config.lut_tables < MAX_LUT_TABLES else
                      f"a POST names at most {MAX_LUT_TABLES}")
            raise ResourceError(
                f"Layer '{node.name}': its {node.attrs.get('activation', 'activation')} "
                f"needs activation table {lut}, but the {self.config.name} architecture "
                f"has {self.config.lut_tables} (lut_tables); {advice}")
        return lut

    def _emit(self, spec: "_LayerSpec", folded: np.ndarray, target: Placement,
              lut: int) -> "tuple[int, int, int, int, int] | None":
        """Emit the tiles of a layer; returns their nest ``(M, N, K1, K2, K3)`` when every
        N tile has the same K tiles in kernel-row, column (or source), block order."""
        cfg, rows, cols = self.config, self.config.rows, self.config.cols
        n_out, kh, kw = spec.phys.shape[:3]
        oh, ow = spec.out_hw
        sy, sx = spec.strides
        dy, dx = spec.dilations
        pt, pl = spec.pads[0], spec.pads[1]
        n_tiles = tiling.n_tiles(n_out, rows, cols, spec.pool_max)
        par_addr = self.params(spec, folded, n_tiles)
        k_tiles, tile_addr = self._weight_tiles(spec, n_tiles)
        first_of_layer = True
        # M tiles of whole output rows where a row fits half the accumulators, so that
        # every tile starts at column 0 (a nest steps its rows by a constant)
        m_total = oh * ow
        m_tile = min(m_total, cfg.acc_half if ow > cfg.acc_half else ow * tiling.tile_rows(
            oh, ow, [len(k_tiles[n0]) for n0, _ in n_tiles], n_tiles, cfg))
        if spec.scatter is not None and 1 < ow <= cfg.acc_half:
            m_tile = ow        # a scattered row is one POST: one per tile keeps the nest
        for m0 in range(0, m_total, m_tile):
            mt = min(m_tile, m_total - m0)
            oy0, ox0 = divmod(m0, ow)
            for n_index, (n0, nt) in enumerate(n_tiles):
                acc_base = (self.output_tiles % 2) * cfg.acc_half
                self.output_tiles += 1
                for k_index, (index, ky, kx, cb) in enumerate(k_tiles[n0]):
                    src = spec.sources[index]
                    iy0 = oy0 * sy + ky * dy - pt
                    ix0 = ox0 * sx + kx * dx - pl
                    ixr = kx * dx - pl
                    # without padding no read is outside its source, and every tile has
                    # the first source's (so that the sources of an Add form one nest)
                    padding = spec.padding(src)
                    matmul = dict(
                        op=Op.MATMUL, wait=int(first_of_layer), first=int(k_index == 0),
                        count=mt, wgt_addr=tile_addr[n0, index, ky, kx, cb], acc_addr=acc_base,
                        act_addr=src.base + (iy0 * src.iw + ix0) * src.cb + cb,
                        act_row=src.base + (iy0 * src.iw + ixr) * src.cb + cb,
                        ow=ow, ox0=ox0, ih=src.ih, iw=src.iw, iy0=iy0, ix0=ix0, ixr=ixr,
                        sy=sy, sx=sx, step_x=sx * src.cb, step_y=sy * src.iw * src.cb,
                        zp=padding if any(spec.pads) else spec.padding(spec.sources[0]),
                        pool_max=int(spec.pool_max), wpack=self.wpack)
                    first_of_layer = False
                    posts = []
                    if k_index == len(k_tiles[n0]) - 1:
                        posts = self.posts(spec, target, acc_base, (m0, mt), (n0, nt),
                                           par_addr, n_index, lut)
                    self.tiles.append(Tile(matmul, posts))
        return tiling.nest(k_tiles, -(-m_total // m_tile), len(n_tiles))

    def params(self, spec: "_LayerSpec", folded: np.ndarray, n_tiles
               ) -> "dict[tuple[int, int | None], int]":
        """Store the parameter words of a layer: one per N tile, or per N tile and window
        count (average pooling with count_include_pad=0); returns their addresses."""
        par_addr = {}
        variants = [None] if spec.counts is None else sorted(set(spec.counts.tolist()))
        for n_index, (n0, nt) in enumerate(n_tiles):
            for k in variants:
                mult, shift = (spec.mult, spec.shift) if k is None else (spec.mult[k - 1],
                                                                         spec.shift[k - 1])
                par_addr[n_index, k] = len(self.par)
                key = tuple(tuple(int(v) for v in x[n0:n0 + nt]) for x in (folded, mult, shift))
                if key not in self._param_words:
                    self._param_words[key] = _param_word(*key, self.param_layout)
                self.par.append(self._param_words[key])
        return par_addr

    def posts(self, spec: "_LayerSpec", target: Placement, acc_base: int, m_tile, n_tile,
              par_addr, n_index: int, lut: int) -> "list[dict]":
        """The POSTs of output pixels ``m0 .. m0 + mt - 1`` and channels ``n0 .. n0 + nt - 1``
        from accumulator word ``acc_base`` on."""
        (m0, mt), (n0, nt), rows = m_tile, n_tile, self.config.rows
        runs = tiling.post_runs(spec.counts, m0, mt)
        stride = target.cb
        ow = spec.out_hw[1]
        if spec.scatter is not None:         # output pixel (y, x) is target pixel
            row_step, col_step, offset = spec.scatter        # offset + y row_step + x col_step
            if ow == 1:                      # a column: one POST with the row step
                stride = row_step * target.cb
            else:                            # one POST per output row
                runs = [(m, min(start + length, (m // ow + 1) * ow) - m, k)
                        for start, length, k in runs for m in range(start, start + length)
                        if m == start or m % ow == 0]
                stride = col_step * target.cb

        def pixel(m: int) -> int:
            if spec.scatter is None:
                return m
            y, x = divmod(m, ow)
            return offset + y * row_step + x * col_step

        return [dict(op=Op.POST, acc_addr=acc_base + start - m0, count=length,
                     par_addr=par_addr[n_index, k],
                     out_addr=target.base + pixel(start) * target.cb + n0 // rows,
                     out_stride=stride, nw=(n0 + nt - 1) // rows - n0 // rows + 1,
                     lane_off=n0 % rows, nt=nt, zp=spec.out_zp, lo=spec.lo, hi=spec.hi,
                     rne=int(spec.rounding == "ort"), lut=lut)
                for start, length, k in runs]

    def finish(self, loops: bool = True, before: "dict[int, list[dict]] | None" = None,
               after: "dict[int, list[dict]] | None" = None) -> "list[Instr]":
        """The stored program: each layer looped where its tiles allow it (``loops``), its
        micro-instructions (:func:`~.loops.schedule`) otherwise, then END; the instructions
        ``before`` and ``after`` a layer index around it (LOADX: :mod:`.stream`; LOADA,
        STOREA: :mod:`.spill`). Weight banks alternate from tile to tile across the whole
        program."""
        program, bank = [], 0
        for index, layer in enumerate(self.layer_tiles):
            program.extend(Instr(f, index) for f in (before or {}).get(index, []))
            if layer.records is not None:          # not on the array: stored as it is
                program.extend(Instr(r, index) for r in layer.records)
            else:
                looped = compress(layer, bank, self.config) if loops else None
                records = list(looped) if looped else schedule(layer.tiles, bank)
                program.extend(Instr(r, index) for r in records)
                bank = (bank + len(layer.tiles)) % 2
            program.extend(Instr(f, index) for f in (after or {}).get(index, []))
        program.append(Instr({"op": Op.END}, self.layer_count - 1))
        return program

    def images(self) -> "dict[str, list[int]]":
        images = {"wgt": list(self.wgt), "par": list(self.par)}
        if self.tables:            # entry 256 t + i: table t at the int8 value i - 128
            images["lut"] = [v & 0xFF for table in self.tables for v in table]
        return images


#: Packed weight tiles the builder keeps for the next bands of a layer.
_TILE_CACHE = 1 << 16


def _param_word(bias, mult, shift, layout) -> int:
    """One parameter word in the HDL's :class:`~hwonnx.hdl.layouts.ParamLayout` ``layout``;
    unused channels hold (0, 0, 1)."""
    channels = [{"bias": int(bias[c]), "mult": int(mult[c]), "shift": int(shift[c])}
                if c < len(bias) else {"bias": 0, "mult": 0, "shift": 1}
                for c in range(layout.length)]
    return layout.const(channels).as_value().value
