"""Every integer layer as a convolution over its sources (:class:`LayerSpec`): the
physical weights ``[N, KH, KW, lanes]`` with each source's channel lanes side by side, the
requantization, the window and, for an op written by several layers (a transposed
convolution's phases, a Concat along height or width), where each one's output pixels go.
One function per integer array op (``*_spec``: its layer; ``*_specs``: its layers, named), which
its lowering (:mod:`.lowerings`) hands to the :class:`~.emitter.TileEmitter`."""

from dataclasses import dataclass

import numpy as np

from ..errors import ResourceError
from ..golden.im2col import conv_output_size
from ..golden.ops import window_counts
from ..ir import Graph, Node
from .digest import digest, remember
from .layout import Placement
from .phases import phases
from .taps import packed_spec_fields

__all__ = ["Source", "LayerSpec", "MAX_PHYS_ELEMENTS", "add_spec", "channel_permute_spec",
           "concat_hw_specs",
           "concat_spec", "conv_spec", "dense_spec", "permute_specs", "phase_specs", "pool_spec",
           "slice_spec"]

#: The most elements of one layer's physical weights ``[N, KH, KW, lanes]`` (512 MiB of
#: int64) beyond twice the layer's own weights. The compiler holds them whole, ``N x lanes``
#: per kernel tap: about the weights of a convolution or a Gemm, but for a layer that reads
#: one input channel per output channel (a depthwise convolution, a pooling, an Add, a copy)
#: the square of its channels, nearly all zeros.
MAX_PHYS_ELEMENTS = 1 << 26


def _phys_zeros(node: Node, n_out: int, kh: int, kw: int, lanes: int, weights: int
                ) -> np.ndarray:
    """Zeroed physical weights ``[n_out, kh, kw, lanes]`` of ``node``'s layer, which has
    ``weights`` weights of its own (the others stay zero).

    Raises
    ------
    ResourceError
        If they would have more than :data:`MAX_PHYS_ELEMENTS` elements and more than twice
        ``weights``.
    """
    elements = n_out * kh * kw * lanes
    if elements > max(MAX_PHYS_ELEMENTS, 2 * weights):
        raise ResourceError(f"Layer '{node.name}' has {n_out} output channels x {kh}x{kw} "
                            f"taps x {lanes} input lanes of weights, {elements} elements as "
                            f"the compiler holds them, of which {weights} are its own: more "
                            f"than hwonnx's limit of {MAX_PHYS_ELEMENTS}")
    return np.zeros((n_out, kh, kw, lanes), dtype=np.int64)


@dataclass(frozen=True)
class Source:
    """How a layer reads one input: its placement, words per pixel and zero point."""
    base: int
    ih: int
    iw: int
    cb: int
    zp: int


@dataclass
class LayerSpec:
    """A layer as a convolution over its sources: ``phys`` is ``[N, KH, KW, lanes]`` with the
    sources' channel lanes side by side (``offsets``)."""
    sources: "list[Source]"
    offsets: "list[int]"
    phys: np.ndarray
    bias: np.ndarray
    mult: np.ndarray
    shift: np.ndarray
    out_hw: "tuple[int, int]"
    strides: "tuple[int, int]"
    pads: "tuple[int, int, int, int]"
    dilations: "tuple[int, int]"
    out_zp: int
    lo: int
    hi: int
    macs: int
    rounding: str = "half_up"      # or "ort": onnxruntime's (POST ``rne``)
    pool_max: bool = False         # one tap per K tile, the accumulators keep the maximum
    table: "tuple[int, ...] | None" = None     # activation table after the requantization
    counts: "np.ndarray | None" = None         # real pixels per window (count_include_pad=0)
    depthwise: bool = False        # output channel n reads only input channel n
    dense: bool = False            # every weight block may be non-zero (keep them all)
    pad: "int | None" = None       # int8 padding value of a folded constant Pad
    #: (row_step, col_step, offset): output pixel (y, x) is target pixel offset + y row_step +
    #: x col_step (a phase of a transposed convolution, :mod:`.phases`; a source of a Concat
    #: along height or width; a part of a Permute)
    scatter: "tuple[int, int, int] | None" = None

    def padding(self, source: Source) -> int:
        """The value the feeder reads at padding positions of ``source`` (MATMUL ``zp``)."""
        if self.pad is not None:
            return self.pad
        return -128 if self.pool_max else source.zp


def _image_source(node: Node, placement: Placement, zp: int, rows: int) -> Source:
    if not placement.is_natural_image(rows):
        raise ResourceError(f"Layer '{node.name}': its input is a reshaped tensor that is not "
                            f"an image in [1, C, H, W] order")
    return Source(placement.base, placement.height, placement.width, placement.cb, zp)


def _vector_lanes(placement: Placement, elements: int) -> np.ndarray:
    """The physical lane (within the placement's words) of each logical element of a vector
    (a Flatten of an image keeps the image's pixel-major order)."""
    return np.argsort(np.where(placement.logical >= 0, placement.logical, 1 << 40))[:elements]


def _concat_spec(node: Node, placements: "list[Placement]", graph: Graph, rows: int,
                 out: dict) -> LayerSpec:
    """Channel concatenation as a block-diagonal 1x1 convolution over all sources: output
    channel ``c``, channel ``c'`` of source ``j``, has weight 1 on that source lane and 0
    elsewhere (the zero K tiles are skipped), and its own multiplier."""
    consts = graph.constants
    mult, shift = consts[node.inputs[-2]], consts[node.inputs[-1]]
    image = len(placements[0].shape) == 4
    sources, offsets, columns = [], [], []
    width = 0
    for placement, zp in zip(placements, node.attrs["zps"]):
        if image:
            source = _image_source(node, placement, int(zp), rows)
            lanes = np.arange(placement.shape[1])
        else:
            source = Source(placement.base, 1, 1, placement.words, int(zp))
            lanes = _vector_lanes(placement, int(np.prod(placement.shape[1:])))
        sources.append(source)
        offsets.append(width)
        columns.append(width + lanes)
        width += source.cb * rows
    lanes = np.concatenate(columns)
    channels = len(lanes)
    phys = _phys_zeros(node, channels, 1, 1, width, channels)
    phys[np.arange(channels), 0, 0, lanes] = 1
    h, w = (placements[0].height, placements[0].width) if image else (1, 1)
    return LayerSpec(sources, offsets, phys, np.zeros(channels, dtype=np.int64), mult, shift,
                     (h, w), (1, 1), (0, 0, 0, 0), (1, 1), macs=channels * h * w, **out)


def _layer_out(attrs) -> dict:
    """The output fields of a one-layer spec: :func:`_out`'s and a folded Pad's value."""
    table = attrs.get("table")
    return dict(out_zp=int(attrs["out_zp"]), lo=int(attrs["lo"]), hi=int(attrs["hi"]),
                rounding=attrs.get("rounding", "half_up"),
                table=None if table is None else tuple(int(v) for v in table),
                pad=attrs.get("pad_q"))


def dense_spec(node: Node, placements: "list[Placement]", graph: Graph, rows: int
               ) -> LayerSpec:
    """A ``QDense`` as a 1x1 convolution over its input vector's words."""
    consts, attrs = graph.constants, node.attrs
    out = _layer_out(attrs)
    w, bias, mult, shift = (consts[v] for v in node.inputs[1:5])
    source = placements[0]
    k_in, n_out = w.shape
    phys = _phys_zeros(node, n_out, 1, 1, source.words * rows, w.size)
    valid = source.logical >= 0
    phys[:, 0, 0, valid] = w[source.logical[valid]].T
    return LayerSpec([Source(source.base, 1, 1, source.words, int(attrs["in_zp"]))], [0],
                     phys, bias.astype(np.int64), mult, shift, (1, 1), (1, 1),
                     (0, 0, 0, 0), (1, 1), macs=n_out * k_in, dense=True, **out)


def concat_spec(node: Node, placements: "list[Placement]", graph: Graph, rows: int
                ) -> LayerSpec:
    """A ``QConcat`` along the channels (:func:`_concat_spec`)."""
    return _concat_spec(node, placements, graph, rows, _layer_out(node.attrs))


def channel_permute_spec(node: Node, placements: "list[Placement]", graph: Graph, rows: int
                         ) -> LayerSpec:
    """A ``QChannelPermute`` as a 1x1 copy: output channel ``c`` has weight 1 on input lane
    ``channels[c]`` (a 0/1 permutation matrix), requantized per output channel."""
    attrs = node.attrs
    mult, shift = (graph.constants[v] for v in node.inputs[1:3])
    source = _image_source(node, placements[0], int(attrs["in_zp"]), rows)
    channels, h, w = placements[0].shape[1:]
    lanes = np.asarray(attrs["channels"], dtype=np.int64)
    phys = _phys_zeros(node, channels, 1, 1, source.cb * rows, channels)
    phys[np.arange(channels), 0, 0, lanes] = 1
    return LayerSpec([source], [0], phys, np.zeros(channels, dtype=np.int64), mult, shift,
                     (h, w), (1, 1), (0, 0, 0, 0), (1, 1), macs=channels * h * w,
                     **_layer_out(attrs))


def slice_spec(node: Node, placements: "list[Placement]", graph: Graph, rows: int
               ) -> LayerSpec:
    """A ``QSlice`` (:func:`_slice_spec`)."""
    return _slice_spec(node, placements[0], graph, rows, _layer_out(node.attrs))


def add_spec(node: Node, placements: "list[Placement]", graph: Graph, rows: int
             ) -> LayerSpec:
    """A ``QAdd`` as a 1x1 convolution over both inputs, weighted by ``wa`` and ``wb``."""
    consts, attrs = graph.constants, node.attrs
    out = _layer_out(attrs)
    a, b = placements[:2]
    mult, shift = consts[node.inputs[2]], consts[node.inputs[3]]
    image = len(a.shape) == 4
    if image:
        sources = [_image_source(node, a, int(attrs["za"]), rows),
                   _image_source(node, b, int(attrs["zb"]), rows)]
        channels = a.shape[1]
    else:
        sources = [Source(p.base, 1, 1, p.words, int(attrs[z]))
                   for p, z in ((a, "za"), (b, "zb"))]
        channels = int(np.prod(a.shape[1:]))
    # each source with its own lanes: two vectors can be placed differently (a Gemm
    # output and a Flatten of an image), so b's lanes are not a's
    offsets = [0, sources[0].cb * rows]
    key = ("add", channels, offsets[1], sources[1].cb * rows, int(attrs["wa"]),
           int(attrs["wb"]))
    phys = _SHARED.get(key) if image else None
    if phys is None:
        phys = _phys_zeros(node, channels, 1, 1, offsets[1] + sources[1].cb * rows,
                           2 * channels)
        for placement, offset, weight in zip((a, b), offsets, (attrs["wa"], attrs["wb"])):
            lanes = np.arange(channels) if image else _vector_lanes(placement, channels)
            phys[np.arange(channels), 0, 0, offset + lanes] = int(weight)
        if image:
            phys = _shared(key, phys)
    h, w_ = (a.height, a.width) if image else (1, 1)
    return LayerSpec(sources, offsets, phys, np.zeros(channels, dtype=np.int64), mult,
                     shift, (h, w_), (1, 1), (0, 0, 0, 0), (1, 1),
                     macs=2 * channels * h * w_, **out)


def pool_spec(node: Node, placements: "list[Placement]", graph: Graph, rows: int
              ) -> LayerSpec:
    """A ``QAvgPool`` or ``QMaxPool`` as a depthwise convolution with weights of one."""
    consts, attrs = graph.constants, node.attrs
    out = _layer_out(attrs)
    source = _image_source(node, placements[0], int(attrs["in_zp"]), rows)
    channels = placements[0].shape[1]
    kh, kw = attrs["kernel"]
    key = ("ones", channels, kh, kw)
    w = _SHARED.get(key)
    if w is None:
        w = _shared(key, np.ones((channels, 1, kh, kw), dtype=np.int64))
    bias, group = np.zeros(channels, dtype=np.int64), channels
    dilations = tuple(attrs.get("dilations", (1, 1)))
    mult, shift = consts[node.inputs[1]], consts[node.inputs[2]]
    out["pool_max"] = node.op == "QMaxPool"
    if mult.ndim == 2:          # count_include_pad=0: a multiplier per window count
        out["counts"] = window_counts((source.ih, source.iw), (kh, kw), attrs["strides"],
                                      attrs["pads"])
    return _windowed_spec(node, source, w, group, dilations, bias, mult, shift, out, rows)


def conv_spec(node: Node, placements: "list[Placement]", graph: Graph, rows: int
              ) -> LayerSpec:
    """A ``QConv``: over its input packed for it (:mod:`.taps`), or its image."""
    consts, attrs = graph.constants, node.attrs
    out = _layer_out(attrs)
    if placements[0].packed:          # a graph input packed for this convolution (.taps)
        return _packed_spec(node, placements[0], graph, rows, out)
    source = _image_source(node, placements[0], int(attrs["in_zp"]), rows)
    w, bias, mult, shift = (consts[v] for v in node.inputs[1:5])
    group, dilations = int(attrs.get("group", 1)), tuple(attrs["dilations"])
    return _windowed_spec(node, source, w, group, dilations, bias.astype(np.int64), mult,
                          shift, out, rows)


def _windowed_spec(node: Node, source: Source, w: np.ndarray, group: int, dilations,
                   bias: np.ndarray, mult, shift, out: dict, rows: int) -> LayerSpec:
    """A convolution of ``w`` ``[M, C / group, KH, KW]`` over the image ``source``."""
    attrs = node.attrs
    n_out, c_group, kh, kw = w.shape
    strides, pads = tuple(attrs["strides"]), tuple(attrs["pads"])
    oh = conv_output_size(source.ih, kh, strides[0], pads[0], pads[2], dilations[0])
    ow = conv_output_size(source.iw, kw, strides[1], pads[1], pads[3], dilations[1])
    phys = _conv_phys(node, w, group, source.cb * rows)
    return LayerSpec([source], [0], phys, bias, mult, shift, (oh, ow), strides, pads,
                     dilations, macs=oh * ow * n_out * c_group * kh * kw,
                     depthwise=c_group == 1 and n_out == group,
                     dense=node.op == "QConv" and group == 1, **out)


def _packed_spec(node: Node, placement: Placement, graph: Graph, rows: int,
                 out: dict) -> LayerSpec:
    """The ungrouped ``QConv`` ``node`` over its input packed for it: a 1x1 convolution with
    stride 1 over the packed lanes (:mod:`.taps`), the same MACs."""
    w, bias, mult, shift = (graph.constants[v] for v in node.inputs[1:5])
    source = Source(placement.base, placement.height, placement.width, placement.cb,
                    int(node.attrs["in_zp"]))
    fields = packed_spec_fields(w, placement, rows)
    oh, ow = fields["out_hw"]
    return LayerSpec([source], [0], bias=bias.astype(np.int64), mult=mult, shift=shift,
                     macs=oh * ow * w.size, dense=True, **fields, **out)


def _conv_phys(node: Node, w: np.ndarray, group: int, lanes: int) -> np.ndarray:
    """``[M, KH, KW, lanes]`` physical weights of a (grouped) convolution ``w`` ``[M, C /
    group, KH, KW]``: output channel ``m`` of group ``g`` reads lanes ``[g C/group, (g+1)
    C/group)``. Read-only, and the same array for the same ``w`` (the bands of a layer in
    the external memory, :mod:`.spill`, take its spec again: :data:`_PHYS`)."""
    key = (id(w), group, lanes)
    known = _PHYS.get(key)
    if known is not None and known[0] is w:
        return known[1]
    n_out, c_group, kh, kw = w.shape
    phys = _phys_zeros(node, n_out, kh, kw, lanes, w.size)
    per_group = n_out // group
    for g in range(group):
        outs = slice(g * per_group, (g + 1) * per_group)
        phys[outs, :, :, g * c_group:(g + 1) * c_group] = w[outs].transpose(0, 2, 3, 1)
    phys.flags.writeable = False
    remember(phys, ("conv", digest(w), group, lanes))
    if len(_PHYS) >= _PHYS_CACHE:
        del _PHYS[next(iter(_PHYS))]
    _PHYS[key] = (w, phys)          # (w kept: its id is not reused while the entry lives)
    return phys


def _shared(key: tuple, weights: np.ndarray) -> np.ndarray:
    """``weights`` made read-only and kept by ``key`` (:data:`_SHARED`)."""
    weights.flags.writeable = False
    if len(_SHARED) >= _SHARED_CACHE:
        del _SHARED[next(iter(_SHARED))]
    _SHARED[key] = weights
    return weights


#: The latest weights of an Add's spec (an image's: both inputs' lanes) and of a pooling's
#: (ones), by what they are made of: the same array for each band of the layer in the
#: external memory (:mod:`.spill`), so that the emitter finds its sums and tiles from the
#: band before (:func:`~.digest.digest`) and the pooling its physical weights (:data:`_PHYS`).
_SHARED: "dict[tuple, np.ndarray]" = {}
_SHARED_CACHE = 4


#: The latest physical weights of :func:`_conv_phys`, by weights, groups and lanes.
_PHYS: "dict[tuple, tuple[np.ndarray, np.ndarray]]" = {}
_PHYS_CACHE = 4


def _affine(scatter: "tuple[int, int, int, int, int]") -> "tuple[int, int, int]":
    """``(row_step, col_step, offset)`` in target pixels of output pixel ``(y, x)`` going to
    target pixel ``(sy y + oy, sx x + ox)`` of an image of width ``width``."""
    sy, sx, oy, ox, width = scatter
    return sy * width, sx, oy * width + ox


def _out(attrs) -> dict:
    """The output fields of a layer spec: zero point, clamp, rounding, activation table."""
    return dict(out_zp=int(attrs["out_zp"]), lo=int(attrs["lo"]), hi=int(attrs["hi"]),
                rounding=attrs.get("rounding", "half_up"),
                table=None if attrs.get("table") is None else
                tuple(int(v) for v in attrs["table"]))


def permute_specs(node: Node, placements: "list[Placement]", graph: Graph, rows: int
                   ) -> "list[tuple[str, LayerSpec]]":
    """A ``QPermute`` of ``[1, C, H, W]`` as copies written with strides (``scatter``):
    swapping H and W, one 1x1 copy of each input row ``h`` (the window starting at row ``h``)
    written as output column ``h``; moving input axis ``a`` (H or W) to the channels, one copy
    per input channel ``c``: a kernel spanning axis ``a`` whose tap ``i`` feeds output channel
    ``i`` from lane ``c`` (weight 1), its output row or column written to the output pixels of
    ``c``."""
    attrs = node.attrs
    perm = tuple(attrs["perm"])
    mult, shift = (graph.constants[v] for v in node.inputs[1:3])
    source = _image_source(node, placements[0], int(attrs["in_zp"]), rows)
    _, c, h, w = placements[0].shape
    out_w = graph.types[node.outputs[0]].shape[3]
    lanes = source.cb * rows
    specs = []

    def copy(name, phys, out_hw, pads, scatter):
        n_out = phys.shape[0]
        specs.append((name, LayerSpec(
            [source], [0], phys, np.zeros(n_out, dtype=np.int64), mult, shift, out_hw, (1, 1),
            pads, (1, 1), macs=n_out * out_hw[0] * out_hw[1], scatter=scatter,
            **_out(attrs))))

    if perm[1] == 1:                                   # (0, 1, 3, 2): rows become columns
        phys = _phys_zeros(node, c, 1, 1, lanes, c)
        phys[np.arange(c), 0, 0, np.arange(c)] = 1
        for y in range(h):
            copy(f"row {y}", phys, (1, w), (-y, 0, 0, 0), (0, out_w, y))
        return specs
    axis = perm[1]                                     # 2 (H) or 3 (W) becomes the channels
    extent = h if axis == 2 else w
    kernel = (extent, 1) if axis == 2 else (1, extent)
    other = 3 if axis == 2 else 2                      # the spatial axis that stays spatial
    for ch in range(c):
        phys = _phys_zeros(node, extent, *kernel, lanes, extent)
        taps = np.arange(extent)
        if axis == 2:
            phys[taps, taps, 0, ch] = 1
        else:
            phys[taps, 0, taps, ch] = 1
        out_hw = (1, w) if axis == 2 else (h, 1)
        # the copy's pixels run along ``other``; the channel c is the output row or column
        step, offset = (out_w, ch) if perm[2] == other else (1, ch * out_w)
        scatter = (0, step, offset) if axis == 2 else (step, 0, offset)
        copy(f"channel {ch}", phys, out_hw, (0, 0, 0, 0), scatter)
    return specs


def _slice_spec(node: Node, placement: Placement, graph: Graph, rows: int, out: dict
                ) -> LayerSpec:
    """A window as a 1x1 copy: output channel ``c`` has weight 1 on input lane ``c0 + c``;
    the window's first row and column enter as negative begin pads (the feeder starts
    reading inside the input)."""
    attrs = node.attrs
    mult, shift = (graph.constants[v] for v in node.inputs[1:3])
    shape = graph.types[node.outputs[0]].shape
    zp = int(attrs["in_zp"])
    if len(shape) == 4:
        source = _image_source(node, placement, zp, rows)
        (c0, y0, x0), channels, hw = attrs["starts"], shape[1], tuple(shape[2:])
        lanes, pads = c0 + np.arange(channels), (-y0, -x0, 0, 0)
    else:
        source = Source(placement.base, 1, 1, placement.words, zp)
        (k0,), channels, hw = attrs["starts"], shape[1], (1, 1)
        lanes = _vector_lanes(placement, int(np.prod(placement.shape[1:])))[k0:k0 + channels]
        pads = (0, 0, 0, 0)
    phys = _phys_zeros(node, channels, 1, 1, source.cb * rows, channels)
    phys[np.arange(channels), 0, 0, lanes] = 1
    return LayerSpec([source], [0], phys, np.zeros(channels, dtype=np.int64), mult, shift,
                     hw, (1, 1), pads, (1, 1), macs=channels * hw[0] * hw[1], **out)


def concat_hw_specs(node: Node, placements: "list[Placement]", graph: Graph, rows: int
                     ) -> "list[tuple[str, LayerSpec]]":
    """A ``QConcat`` along height or width: each source copied (1x1, weight 1 per channel,
    requantized by its own row of multipliers) to its place in the output."""
    axis, attrs = node.attrs["axis"], node.attrs
    mult, shift = (graph.constants[v] for v in node.inputs[-2:])
    out_w = graph.types[node.outputs[0]].shape[3]
    specs, offset = [], 0
    for index, (placement, zp) in enumerate(zip(placements, attrs["zps"])):
        source = _image_source(node, placement, int(zp), rows)
        channels, h, w = placement.shape[1:]
        phys = _phys_zeros(node, channels, 1, 1, source.cb * rows, channels)
        phys[np.arange(channels), 0, 0, np.arange(channels)] = 1
        oy, ox = (offset, 0) if axis == 2 else (0, offset)
        specs.append((f"source {index}", LayerSpec(
            [source], [0], phys, np.zeros(channels, dtype=np.int64), mult[index],
            shift[index], (h, w), (1, 1), (0, 0, 0, 0), (1, 1), macs=channels * h * w,
            scatter=(out_w, 1, oy * out_w + ox), **_out(attrs))))
        offset += h if axis == 2 else w
    return specs


def phase_specs(node: Node, placements: "list[Placement]", graph: Graph, rows: int
                 ) -> "list[tuple[str, LayerSpec]]":
    """The layer of each output phase of a ``QConvTranspose`` (:func:`.phases.phases`)."""
    attrs = node.attrs
    source = _image_source(node, placements[0], int(attrs["in_zp"]), rows)
    w, bias, mult, shift = (graph.constants[v] for v in node.inputs[1:5])
    group = int(attrs["group"])
    out = _out(attrs)
    specs = []
    for phase in phases(w, attrs["strides"], attrs["pads"], (source.ih, source.iw),
                        attrs["out_hw"]):
        n_out, c_group = phase.weight.shape[:2]
        oh, ow = phase.out_hw
        specs.append((phase.name, LayerSpec(
            [source], [0], _conv_phys(node, phase.weight, group, source.cb * rows),
            bias.astype(np.int64), mult, shift, phase.out_hw, (1, 1), phase.pads, (1, 1),
            macs=oh * ow * n_out * c_group * phase.taps,
            depthwise=c_group == 1 and n_out == group, scatter=_affine(phase.scatter), **out)))
    return specs
