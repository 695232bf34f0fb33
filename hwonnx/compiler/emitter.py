"""The tile emitter: the tiles, instructions and memory images of a program, emitted layer by
layer (:class:`TileEmitter`). :func:`~.lower.lower` drives it; each op's lowering
(:mod:`.lowerings`), the tile orders (:func:`.tiling.emit_tiles`, :mod:`.depthwise`),
:mod:`.eltwise` and :mod:`.spill` call its methods."""

from typing import Callable

import numpy as np

from ..config import ArchConfig
from ..errors import ResourceError
from ..golden.ops import INT32_MAX, INT32_MIN, accumulate_span
from ..hdl.layouts import ParamLayout
from ..hdl.loader import tile_words
from ..ir import Graph, Node
from ..isa import MAX_LUT_TABLES, Op
from . import depthwise, tiling
from .digest import digest
from .layout import Placement
from .loops import LayerTiles, Tile, compress, schedule
from .lowerings import LOWERINGS
from .micro import MatMul, Post
from .param_words import param_word
from .program import Instr, LayerPlan
from .specs import LayerSpec
from .split import part_spec, part_target, weight_parts
from .stream import StreamPlan, plan_streaming
from .weights import layer_wpack, pack_tile, pack_tiles, weight_bits

__all__ = ["TileEmitter"]


class TileEmitter:
    """Emits the tiles, instructions and memory images of a program, layer by layer.

    :func:`~.lower.lower` hands it each array layer (:meth:`layer`, :meth:`layer_parts`); the
    lowerings (:mod:`.lowerings`), the tile orders (:func:`.tiling.emit_tiles`,
    :mod:`.depthwise`), :mod:`.eltwise` and :mod:`.spill` call its methods, and read it only
    through its properties. ``split``: layers whose weights are too many to stream whole run
    in groups of output channels (:mod:`.split`). ``dry``: the layers' memory images,
    parameters and checks without their tiles (no MATMUL or POST is made: :attr:`dry`)."""

    def __init__(self, graph: Graph, config: ArchConfig, split: bool = False,
                 dry: bool = False, shared: "dict | None" = None):
        self._graph, self._config, self._split, self._dry = graph, config, split, dry
        self._param_layout = ParamLayout(config)
        self._layer_tiles: "list[LayerTiles]" = []
        self._tiles: "list[Tile]" = []         # of the layer being emitted
        self._wgt: "list[int]" = []
        self._par: "list[int]" = []
        self._tables: "list[tuple[int, ...]]" = []    # activation tables, 256 int8 each
        self._output_tiles = 0
        self._wpack = 0                               # of the layer being emitted
        # The bands of a layer (spill.py) emit the same tiles and parameters again: packed
        # once (Amaranth's Layout.const takes about 2 ms a parameter word), and the tile
        # cache bounded to the latest _TILE_CACHE tiles.
        self._param_words: "dict[tuple, int]" = {}
        self._tile_words: "dict[tuple, list[int]]" = {}
        # and a layer's weight tiles whole (:meth:`weight_tiles`), the latest up to
        # _TILE_CACHE tiles' words, its sums and packing, by its weights' digest: in
        # ``shared`` (a dictionary), for the emitters of the next lowerings of a sizing too
        # (:class:`~.replay.Lowerings`: ResNet-18's eleven, 4 s of the first's 5)
        shared = {} if shared is None else shared.setdefault((config.rows, config.cols), {})
        self._layers: "dict[tuple, tuple[dict, dict, list[int]]]" = shared.setdefault(
            "layers", {})
        self._layer_words: "list[int]" = shared.setdefault("layer_words", [0])   # (theirs)
        self._sums: "dict[tuple, tuple]" = shared.setdefault("sums", {})    # _tap_sums
        self._wpacks: "dict[tuple, int]" = shared.setdefault("wpacks", {})

    @property
    def config(self) -> ArchConfig:
        return self._config

    @property
    def graph(self) -> Graph:
        return self._graph

    @property
    def split(self) -> bool:
        return self._split

    @property
    def rows(self) -> int:
        return self._config.rows

    @property
    def dry(self) -> bool:
        """Whether the layers are emitted without their tiles: the weight and parameter
        images, the activation tables, every check a layer's emission makes, and the layer
        plans but for their ``tiles``, which is what decides whether a lowering fails
        (``lower._lowered``); making a tile's MATMUL and POSTs checks nothing."""
        return self._dry

    @property
    def wpack(self) -> int:
        """The weight packing of the layer being emitted (:func:`~.weights.layer_wpack`)."""
        return self._wpack

    @property
    def layer_count(self) -> int:
        """The layers emitted so far (the index of the next one)."""
        return len(self._layer_tiles)

    @property
    def weight_words(self) -> int:
        """The words of the weight image so far."""
        return len(self._wgt)

    @property
    def table_count(self) -> int:
        """The activation tables stored so far (the highest POST ``lut`` field so far)."""
        return len(self._tables)

    @property
    def param_words(self) -> int:
        """The words of the parameter image so far."""
        return len(self._par)

    def layer(self, node: Node, sources: "list[Placement]", target: Placement
              ) -> "list[LayerPlan]":
        """Emit the tiles of one array layer, in parts (:meth:`layer_parts`; the plans'
        ``wgt_words`` are set). Every layer is a convolution over one or more sources: a K
        tile reads one channel block of one source at one kernel tap, so a residual Add is a
        1x1 convolution over both inputs, and pooling a depthwise convolution with weights of
        one; depthwise layers may stream instead (a K tile is then a kernel row:
        :mod:`.depthwise`)."""
        return [emit() for emit in self.layer_parts(node, sources, target)]

    def layer_parts(self, node: Node, sources: "list[Placement]", target: Placement
                    ) -> "list[Callable[[], LayerPlan]]":
        """A function per part of the layer (:meth:`layer`) that emits it and returns its
        plan, from the op's lowering (:data:`~.lowerings.LOWERINGS`): the layer whole, or in
        parts (:meth:`one_layer`), or several layers (:meth:`several_layers`)."""
        def counted(emit):
            def run() -> LayerPlan:
                start = len(self._wgt)
                plan = emit()
                plan.wgt_words = len(self._wgt) - start
                return plan
            return run

        return [counted(emit) for emit in LOWERINGS[node.op](self, node, sources, target)]

    def one_layer(self, node: Node, spec: LayerSpec, target: Placement, channel_parts=None
                  ) -> "list[Callable[[], LayerPlan]]":
        """The parts of the one-layer op ``node`` of ``spec``: groups of output channels whose
        weights stream on their own where ``split`` is on (:func:`~.split.weight_parts`),
        else the layer whole; or the parts ``channel_parts()`` gives (not None: a channel
        concatenation's sources, :func:`~.split.concat_parts`)."""
        rows = self._config.rows
        parts = weight_parts(spec, self._config) if self._split else [(0, spec.phys.shape[0])]
        if channel_parts is not None:
            parts = channel_parts() or parts
        if len(parts) == 1:
            return [lambda: self.emit(node, spec, target)]
        return [lambda c0=c0, c1=c1: self.emit(
                    node, part_spec(spec, c0, c1), part_target(target, c0, rows),
                    f"{node.name} [channels {c0}-{c1 - 1}]")
                for c0, c1 in parts]

    def several_layers(self, node: Node, specs: "list[tuple[str, LayerSpec]]",
                       target: Placement) -> "list[Callable[[], LayerPlan]]":
        """The layers of an op written by several of them, each to its own output pixels
        (``specs``: their names and specs; a transposed convolution's phases, the pieces of a
        height or width concatenation, the copies of a permutation)."""
        return [lambda name=name, spec=spec: self.emit(node, spec, target,
                                                       f"{node.name} [{name}]")
                for name, spec in specs]

    def emit(self, node: Node, spec: LayerSpec, target: Placement,
             name: "str | None" = None) -> LayerPlan:
        """Emit the tiles of the layer ``spec`` (of ``node``) writing ``target``."""
        rows = self._config.rows
        bound = np.abs(spec.bias).astype(np.int64)
        sums = [self._tap_sums(spec.phys, offset, source.cb * rows)
                for source, offset in zip(spec.sources, spec.offsets)]
        for source, (magnitude, _, _) in zip(spec.sources, sums):    # each with its zero
            bound = bound + accumulate_span(source.zp) * magnitude     # point
        if bound.max(initial=0) > INT32_MAX:
            raise ResourceError(f"Layer '{node.name}': output channel {int(bound.argmax())} "
                                f"could overflow the int32 accumulator (sum |w| x |x - zero "
                                f"point| + |bias| up to {int(bound.max())}); split the layer "
                                f"into layers of fewer inputs whose outputs an Add sums")
        # The hardware adds raw activations; the zero points move into the bias. (A maximum
        # is one raw activation, so its zero point moves in once.)
        folded = spec.bias.copy()
        for source, (_, total, largest) in zip(spec.sources, sums):
            folded -= source.zp * (largest if spec.pool_max else total)
        if folded.min(initial=0) < INT32_MIN or folded.max(initial=0) > INT32_MAX:
            raise ResourceError(f"Layer '{node.name}': the bias with the input zero point "
                                f"folded in does not fit int32")
        if spec.rounding == "ort" and not self._config.ort_rounding:
            raise ResourceError(f"Layer '{node.name}' rounds as onnxruntime does, but the "
                                f"{self._config.name} architecture has no ort_rounding unit")
        lut = self.table_index(node, spec.table)
        plan = LayerPlan(name or node.name, node.op, node.outputs[0], int(spec.macs))
        key = digest(spec.phys)
        if key not in self._wpacks:
            self._wpacks[key] = layer_wpack(spec.phys)
        self._tiles, self._wpack = [], self._wpacks[key]
        plan.wgt_bits = weight_bits(self._wpack)
        if depthwise.streams(spec, self._config):
            nest = depthwise.emit_depthwise(self, spec, folded, target, lut)
        else:
            nest = tiling.emit_tiles(self, spec, folded, target, lut)
        self._layer_tiles.append(LayerTiles(self._tiles, nest))
        plan.tiles = len(self._tiles)
        return plan

    def _tap_sums(self, phys: np.ndarray, offset: int, width: int
                  ) -> "tuple[np.ndarray, np.ndarray, np.ndarray]":
        """Per output channel of the lanes ``offset .. offset + width - 1`` of ``phys``:
        the sum of the weights' magnitudes, their sum and their largest; the same for a
        read-only ``phys`` seen before (:func:`~.digest.digest`)."""
        key = (digest(phys), offset, width)
        sums = self._sums.get(key)
        if sums is None:
            taps = phys[..., offset:offset + width].reshape(phys.shape[0], -1)
            sums = (np.abs(taps.astype(np.int64)).sum(axis=1), taps.sum(axis=1),
                    taps.max(axis=1) if taps.size else None)
            if len(self._sums) >= _TAP_SUMS:
                del self._sums[next(iter(self._sums))]
            self._sums[key] = sums
        return sums

    def output_tile(self) -> int:
        """Count a new output tile of the layer being emitted; returns the first word of its
        accumulator half (output tiles alternate between the halves across the program)."""
        acc_base = (self._output_tiles % 2) * self._config.acc_half
        self._output_tiles += 1
        return acc_base

    def add_tile(self, matmul: MatMul, posts: "list[Post]") -> None:
        """Add a tile to the layer being emitted: its MATMUL (without the weight bank, which
        :meth:`finish` assigns) and the POSTs that follow it."""
        self._tiles.append(Tile(matmul, posts))

    def add_records(self, records: list) -> None:
        """Emit a layer that does not run on the array (the element-wise engine): its
        instructions, stored as they are."""
        self._layer_tiles.append(LayerTiles([], records=records))

    def words_since(self, wgt_start: int, par_start: int
                    ) -> "tuple[tuple[int, ...], tuple[int, ...]]":
        """The weight and parameter words from ``wgt_start`` and ``par_start`` on."""
        return tuple(self._wgt[wgt_start:]), tuple(self._par[par_start:])

    def reuse_words(self, wgt_start: int, wgt_at: "int | None", par_start: int,
                    par_at: "int | None") -> None:
        """The last layer's weight words from ``wgt_start`` are a copy of those at ``wgt_at``
        (None: they are its own), its parameter words from ``par_start`` of those at
        ``par_at``: drop the copies and point its tiles at the originals."""
        wgt_delta = 0 if wgt_at is None else wgt_start - wgt_at
        par_delta = 0 if par_at is None else par_start - par_at
        if wgt_at is not None:
            del self._wgt[wgt_start:]
        if par_at is not None:
            del self._par[par_start:]
        if not wgt_delta and not par_delta:
            return
        layer = self._layer_tiles[-1]
        for tile in layer.tiles:
            if wgt_delta:
                tile.matmul = tile.matmul.moved(wgt_addr=tile.matmul.wgt_addr - wgt_delta)
            if par_delta:
                tile.posts = [post.moved(par_addr=post.par_addr - par_delta)
                              for post in tile.posts]
        if layer.records is not None and par_delta:
            layer.records = [record.moved(par_addr=record.par_addr - par_delta)
                             if record.op == Op.POST else record for record in layer.records]

    def stream_weights(self, wgt_words: "list[int]", names: "list[str]",
                       owners: "dict[int, int]") -> "StreamPlan | None":
        """Stream the layers' weights from the external memory where they do not fit the
        weight buffer (:func:`~.stream.plan_streaming`; ``wgt_words``, ``names`` and
        ``owners`` per layer), taking the plan's weight and parameter images; None where
        they fit."""
        streaming = plan_streaming(self._wgt, self._par, wgt_words, self._layer_tiles, names,
                                   self._config, owners)
        if streaming is not None:
            self._wgt, self._par = streaming.wgt, streaming.par
        return streaming

    def weight_tile(self, tile: np.ndarray) -> int:
        """Store a ``rows x cols`` weight tile of the layer being emitted; its address."""
        address = len(self._wgt)
        key = (self._wpack, tile.shape, tile.dtype.str, tile.tobytes())
        words = self._tile_words.get(key)
        if words is None:
            words = self._tile_words[key] = pack_tile(tile, self._wpack)
            if len(self._tile_words) > _TILE_CACHE:
                del self._tile_words[next(iter(self._tile_words))]
        self._wgt.extend(words)
        return address

    def weight_tiles(self, spec: LayerSpec, n_tiles: list) -> "tuple[dict, dict]":
        """Store the weight tiles of the layer ``spec`` for its N tiles ``n_tiles``; returns
        each N tile's K tiles ``(source, ky, kx, block)`` and each tile's address.

        K tiles whose weights are all zero for these channels (grouped and depthwise
        convolutions, the other input of an Add) are skipped; one is kept so that the
        accumulators are initialized. A dense layer keeps them all, so that its tiles stay
        one nest (a weight block that happens to be zero costs a tile, not a program of one
        instruction per tile)."""
        rows, cols = self._config.rows, self._config.cols
        kh, kw = spec.phys.shape[1:3]
        key = (digest(spec.phys), tuple(spec.offsets),
               tuple(source.cb for source in spec.sources), spec.dense, tuple(n_tiles),
               self._wpack)
        start = len(self._wgt)
        if key in self._layers:             # a band of a layer emitted before: the same tiles
            k_tiles, relative, words = self._layers[key]
            self._wgt.extend(words)
            return ({n0: list(k) for n0, k in k_tiles.items()},
                    {tile: start + offset for tile, offset in relative.items()})
        k_tiles, tile_addr = {}, {}
        per_tile = tile_words(self._config, self._wpack)
        last = len(spec.sources) - 1
        for n0, nt in n_tiles:
            kept, gathered = [], []
            for index, (source, offset) in enumerate(zip(spec.sources, spec.offsets)):
                blocks = spec.phys[n0:n0 + nt, :, :, offset:offset + source.cb * rows
                                   ].reshape(nt, kh, kw, source.cb, rows)
                if spec.dense:
                    nonzero = np.ones((kh, kw, source.cb), dtype=bool)
                else:       # found at once: a depthwise layer has channels^2 blocks
                    nonzero = blocks.any(axis=(0, 4))
                if index == last and not kept and not nonzero.any():
                    nonzero[-1, -1, -1] = True
                at = np.nonzero(nonzero)            # (ky, kx, cb) in order, as argwhere's
                kept += [(index, ky, kx, cb) for ky, kx, cb in zip(*(a.tolist() for a in at))]
                gathered.append(blocks[:, at[0], at[1], at[2], :])     # [nt, tiles, rows]
            k_tiles[n0] = kept
            tiles = np.zeros((len(kept), rows, cols), dtype=np.int64)
            tiles[:, :, :nt] = np.concatenate(gathered, axis=1).transpose(1, 2, 0)
            first = len(self._wgt)
            tile_addr.update(((n0, *k), first + t * per_tile) for t, k in enumerate(kept))
            self._wgt += pack_tiles(tiles, self._wpack)         # the N tile's, in order
        words = self._wgt[start:]
        self._layers[key] = ({n0: list(k) for n0, k in k_tiles.items()},
                             {tile: a - start for tile, a in tile_addr.items()}, words)
        self._layer_words[0] += len(words)
        while self._layer_words[0] > _TILE_CACHE * cols and len(self._layers) > 1:
            self._layer_words[0] -= len(self._layers.pop(next(iter(self._layers)))[2])
        return k_tiles, tile_addr

    def table_index(self, node: Node, table: "tuple[int, ...] | None") -> int:
        """The POST ``lut`` field of a layer's activation ``table`` (0: none), stored once."""
        if table is None:
            return 0
        if table not in self._tables:
            self._tables.append(table)
        lut = self._tables.index(table) + 1
        if lut > self._config.lut_tables:
            advice = ("raise --lut-tables or use a board whose array has more"
                      if self._config.lut_tables < MAX_LUT_TABLES else
                      f"a POST names at most {MAX_LUT_TABLES}")
            raise ResourceError(
                f"Layer '{node.name}': its {node.attrs.get('activation', 'activation')} "
                f"needs activation table {lut}, but the {self._config.name} architecture "
                f"has {self._config.lut_tables} (lut_tables); {advice}")
        return lut

    def params(self, spec, folded: np.ndarray, n_tiles
               ) -> "dict[tuple[int, int | None], int]":
        """Store the parameter words of a layer: one per N tile, or per N tile and window
        count (average pooling with count_include_pad=0); returns their addresses."""
        par_addr = {}
        variants = [None] if spec.counts is None else sorted(set(spec.counts.tolist()))
        for n_index, (n0, nt) in enumerate(n_tiles):
            for k in variants:
                mult, shift = (spec.mult, spec.shift) if k is None else (spec.mult[k - 1],
                                                                         spec.shift[k - 1])
                par_addr[n_index, k] = len(self._par)
                key = tuple(tuple(int(v) for v in x[n0:n0 + nt]) for x in (folded, mult, shift))
                if key not in self._param_words:
                    self._param_words[key] = param_word(*key, self._param_layout)
                self._par.append(self._param_words[key])
        return par_addr

    def posts(self, spec: LayerSpec, target: Placement, acc_base: int, m_tile, n_tile,
              par_addr, n_index: int, lut: int) -> "list[Post]":
        """The POSTs of output pixels ``m0 .. m0 + mt - 1`` and channels ``n0 .. n0 + nt - 1``
        from accumulator word ``acc_base`` on."""
        (m0, mt), (n0, nt), rows = m_tile, n_tile, self._config.rows
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

        return [Post.of(acc_addr=acc_base + start - m0, count=length,
                        par_addr=par_addr[n_index, k],
                        out_addr=target.base + pixel(start) * target.cb + n0 // rows,
                        out_stride=stride, nw=(n0 + nt - 1) // rows - n0 // rows + 1,
                        lane_off=n0 % rows, nt=nt, zp=spec.out_zp, lo=spec.lo, hi=spec.hi,
                        rne=int(spec.rounding == "ort"), lut=lut)
                for start, length, k in runs]

    def finish(self, loops: bool = True, before: "dict[int, list] | None" = None,
               after: "dict[int, list] | None" = None) -> "list[Instr]":
        """The stored program: each layer looped where its tiles allow it (``loops``), its
        micro-instructions (:func:`~.loops.schedule`) otherwise, then END; the instructions
        ``before`` and ``after`` a layer index around it (LOADX: :mod:`.stream`; LOADA,
        STOREA: :mod:`.spill`). Weight banks alternate from tile to tile across the whole
        program."""
        program, bank = [], 0
        for index, layer in enumerate(self._layer_tiles):
            program.extend(Instr(r.fields(), index) for r in (before or {}).get(index, []))
            if layer.records is not None:          # not on the array: stored as it is
                program.extend(Instr(r.fields(), index) for r in layer.records)
            else:
                looped = compress(layer, bank, self._config) if loops else None
                if looped:
                    program.extend(Instr(fields, index) for fields in looped)
                else:
                    program.extend(Instr(r.fields(), index)
                                   for r in schedule(layer.tiles, bank))
                bank = (bank + len(layer.tiles)) % 2
            program.extend(Instr(r.fields(), index) for r in (after or {}).get(index, []))
        program.append(Instr({"op": Op.END}, len(self._layer_tiles) - 1))
        return program

    def images(self) -> "dict[str, list[int]]":
        images = {"wgt": list(self._wgt), "par": list(self._par)}
        if self._tables:            # entry 256 t + i: table t at the int8 value i - 128
            images["lut"] = [v & 0xFF for table in self._tables for v in table]
        return images


#: Packed weight tiles the builder keeps for the next bands of a layer.
_TILE_CACHE = 1 << 16
#: Layers' weight sums the builder keeps for the next bands (:meth:`TileEmitter._tap_sums`).
_TAP_SUMS = 64
