"""Activations in the external memory (``ArchConfig.ext_memory``): a tensor too large for the
activation buffer lives in the external memory, and every layer that reads or writes it runs
in bands of output rows (``docs/architecture.md``, "Activations in the external memory").

For band ``[o0, o1)`` of a layer, each input's rows that the band reads (the kernel's halo
included) are either a view of the input in the activation buffer or, for an input in the
external memory, a copy that LOADA brings into a window of the input staging buffer first
(``ArchConfig.stage_in_depth``); the band is the layer itself, as a convolution over those rows
with its top and bottom padding cut to what falls outside the image, writing its output rows
into a view of the output or into a window of the output staging buffer that STOREA copies
out after it. A tensor's rows are consecutive words (pixel-major layout), so each copy is one
transfer. The staging buffers are memories of their own (``hdl/top.py``), so the transfers
run beside the computation: with two windows in each, the next band's rows come in and the
last band's go out while a band computes (:func:`band_layer`).

The bands of one layer share its weight and parameter words (:func:`share_words`). A global
pool whose input does not fit the input staging buffer runs in groups of channels instead
(:func:`_global_pool`)."""

from dataclasses import dataclass, replace

from ..errors import ResourceError
from ..ir import Graph, Node
from ..isa import Op
from .layout import Placement, natural_placement
from .micro import Transfer
from .specs import conv_spec
from .split import part_target, weight_parts, words_per_group

__all__ = ["BANDED", "ExtTensors", "StageTooSmall", "bandable", "band_layer", "relocated",
           "share_words", "spill_attempts"]

#: Integer layers that can run in bands of output rows.
BANDED = ("QConv", "QConvTranspose", "QAvgPool", "QMaxPool", "QAdd", "QEltwise", "QConcat")


def _window(node: Node, graph: Graph) -> "tuple[int, int, int, int, int]":
    """``(kernel, stride, dilation, pad_top, pad_bottom)`` of ``node`` along the height."""
    attrs = node.attrs
    if node.op in ("QConv", "QConvTranspose"):
        kh = graph.constants[node.inputs[1]].shape[2]
    elif node.op in ("QAvgPool", "QMaxPool"):
        kh = attrs["kernel"][0]
    else:
        return 1, 1, 1, 0, 0
    dilation = tuple(attrs.get("dilations", (1, 1)))[0]
    pads = tuple(attrs["pads"])
    return kh, tuple(attrs["strides"])[0], dilation, pads[0], pads[2]


def bandable(node: Node, graph: Graph) -> bool:
    """Whether ``node`` can run in bands of rows: a layer of :data:`BANDED` whose output
    and activation inputs are images (``[1, C, H, W]``); a concatenation along the channels
    only (along the height or width its sources' rows are not the band's)."""
    if node.op not in BANDED or (node.op == "QConcat" and node.attrs.get("axis", 1) != 1):
        return False
    shapes = [graph.types[v].shape for v in node.inputs
              if v and v not in graph.constants]
    return len(graph.types[node.outputs[0]].shape) == 4 and all(len(s) == 4 for s in shapes)


def spill_attempts(graph: Graph, config) -> "list[frozenset[str]]":
    """The sets of tensors to try in the external memory, in order: the candidates larger
    than the whole activation buffer, then with them those of at least a threshold of words,
    halved from the largest of the others down to one word. A candidate is an image written by
    the host (a graph input) or a banded layer and read only by banded layers or the host (a
    graph output)."""
    readers: "dict[str, list[Node]]" = {}
    for node in graph.nodes:
        for value in node.inputs:
            readers.setdefault(value, []).append(node)
    words = {}
    for node in graph.nodes:
        value = node.outputs[0] if node.outputs else None
        if (value and graph.types[value].dtype == "int8"
                and len(graph.types[value].shape) == 4
                and (node.op == "Quantize" or bandable(node, graph))
                and all(r.op == "Dequantize" or bandable(r, graph)
                        for r in readers.get(value, ()))):
            words[value] = natural_placement(0, graph.types[value].shape, config.rows).words
    must = frozenset(v for v, w in words.items() if w > config.act_depth)
    attempts = [must] if must else []
    threshold = max((w for v, w in words.items() if v not in must), default=0)
    while threshold >= 1:
        attempts.append(must | frozenset(v for v, w in words.items() if w >= threshold))
        threshold //= 2
    return attempts


@dataclass
class ExtTensors:
    """Where the tensors in the external memory are (word addresses from the start of the
    activation region, which follows the streamed weights: :func:`relocated`)."""
    rows: int
    where: "dict[str, tuple[int, tuple[int, ...]]]"     # value -> (address, shape)
    words: int = 0
    stage: "tuple[int, int]" = (0, 0)   # the staging buffers' words the bands use (in, out)

    def place(self, value: str, shape: "tuple[int, ...]") -> None:
        self.where[value] = (self.words, tuple(shape))
        self.words += natural_placement(0, shape, self.rows).words


def relocated(records: "dict[int, list[Transfer]]", base: int
              ) -> "dict[int, list[Transfer]]":
    """The transfers ``records`` (layer index -> LOADA and STOREA) with the activation region
    at external word ``base``."""
    return {index: [replace(record, ext_addr=record.ext_addr + base) for record in transfers]
            for index, transfers in records.items()}


def _band_node(node: Node, graph: Graph, o0: int, o1: int, height: int
               ) -> "tuple[Node, int, int]":
    """The layer computing output rows ``[o0, o1)`` from the input rows ``[r0, r1)`` it
    returns, its padding cut to the rows outside the input's ``height``. A transposed
    convolution's output row ``o`` takes input row ``i`` through kernel row ``o + pad_top - i
    stride``: the band reads the rows with a kernel row for one of its own, and its top
    padding puts its first row at ``o0`` (``o - o0 = (i - r0) stride + k - pad'``)."""
    kh, stride, dilation, top, _ = _window(node, graph)
    attrs = dict(node.attrs)
    if node.op == "QConvTranspose":
        r0 = min(height - 1, max(0, -(-(o0 + top - kh + 1) // stride)))
        r1 = max(r0 + 1, min(height, (o1 - 1 + top) // stride + 1))   # a row of bias: any
        pads = tuple(attrs["pads"])
        attrs["pads"] = (top + o0 - r0 * stride, pads[1], 0, pads[3])
        attrs["out_hw"] = (o1 - o0, tuple(attrs["out_hw"])[1])
    else:
        lo = o0 * stride - top
        hi = (o1 - 1) * stride - top + (kh - 1) * dilation + 1
        r0, r1 = max(0, lo), min(height, hi)
        if "pads" in attrs:
            pads = tuple(attrs["pads"])
            attrs["pads"] = (r0 - lo, pads[1], hi - r1, pads[3])
    name = f"{node.name} [rows {o0}-{o1 - 1}]"
    return replace(node, name=name, attrs=attrs), r0, r1


def _rows(placement: Placement, r0: int, r1: int, rows: int, base: "int | None" = None
          ) -> Placement:
    """Rows ``[r0, r1)`` of an image ``placement``: a view of them, or at ``base``."""
    _, c, _, w = placement.shape
    start = placement.base + r0 * w * placement.cb if base is None else base
    return natural_placement(start, (1, c, r1 - r0, w), rows)


class StageTooSmall(ResourceError):
    """The staging buffers (``ArchConfig.stage_in_depth``, ``stage_out_depth``) cannot hold a
    layer's windows of a band of one row; ``words``: the depth each needs (in, out)."""

    def __init__(self, message: str, words: "tuple[int, int]"):
        super().__init__(message)
        self.words = words


def _slot(base: int, stage: int, parity: int, words: int) -> int:
    """The first word of slot ``parity`` of ``words`` in a staging buffer from ``base`` of
    ``stage`` words: slot 0 at its start, slot 1 at its end."""
    return base if parity == 0 else base + stage - words


def _bands(node: Node, graph: Graph, full: dict, external: list, out_row: int,
           stage: "tuple[int, int]", streamed: int = 0) -> "tuple[list, dict, int, int, int]":
    """The bands of ``node``: ``(cuts, words, in_words, out_words, slots)``, the tallest
    whose windows fit the staging buffers (``stage``: their depths, in and out) twice
    (``slots`` 2: double-buffered), or else once (1); ``cuts`` are ``(o0, o1, band node, r0,
    r1)``, ``words`` each ``external`` input's window, ``out_row`` the words of an output row
    in the output staging buffer (0: the output is on chip). Raises :class:`StageTooSmall`
    when not even bands of one row fit.

    ``streamed``: the weight words every band streams again (a layer in parts,
    :func:`_restreamed`). Then the tallest single-buffered bands are taken instead where
    they cost fewer words: each band's weights, plus its windows' words, counted twice when
    single-buffered (those transfers then no longer run beside the computation)."""
    out_height = graph.types[node.outputs[0]].shape[2]
    height = max(placement.shape[2] for placement in full.values())
    single, options = None, []
    for slots in (2, 1):
        for band in range(out_height, 0, -1):
            spans = [(o0, min(o0 + band, out_height)) for o0 in range(0, out_height, band)]
            cuts = [(o0, o1) + _band_node(node, graph, o0, o1, height) for o0, o1 in spans]
            tallest = max(r1 - r0 for _, _, _, r0, r1 in cuts)
            words = {v: (1 if full[v].shape[2] == 1 else tallest) * full[v].shape[3]
                     * full[v].cb for v in external}    # a per-channel operand: whole
            in_words, out_words = sum(words.values()), band * out_row
            if slots * in_words <= stage[0] and slots * out_words <= stage[1]:
                cost = len(cuts) * (streamed + (3 - slots) * (in_words + out_words))
                options.append((cost, -slots, (cuts, words, in_words, out_words, slots)))
                break
            single = (in_words, out_words)
        if options and not streamed:
            break
    if options:
        return min(options, key=lambda option: option[:2])[2]
    raise StageTooSmall(f"Layer '{node.name}' moves its rows through the staging buffers in "
                        f"bands of one row: they need {single[0]} and {single[1]} words "
                        f"(stage_in_depth, stage_out_depth), the architecture has "
                        f"{stage[0]} and {stage[1]}", single)


def _restreamed(emitter, node: Node, graph: Graph, sources: "list[Placement]") -> int:
    """The weight words each band of ``node`` streams: all of a convolution's when it runs in
    parts of output channels (:func:`~.split.weight_parts`; the bands of a layer of one part
    share its one LOADX instead), else 0."""
    config = emitter.config
    if not emitter.split or node.op != "QConv":
        return 0
    spec = conv_spec(node, sources, graph, config.rows)
    if len(weight_parts(spec, config)) < 2:
        return 0
    return words_per_group(spec, config) * -(-spec.phys.shape[0] // config.cols)


def band_layer(emitter, node: Node, graph: Graph, inputs: "list[str]",
               placements: "dict[str, Placement]", ext: ExtTensors,
               into: "tuple[dict, dict, dict]") -> list:
    """Emit ``node`` in bands (some of its ``inputs`` or its output in ``ext``); returns the
    bands' layer plans (each band one layer per part: :mod:`.split`). The bands are layers
    ``len(emitter.layer_tiles)`` on; their LOADA and STOREA go into the first two
    dictionaries of ``into`` (layer index -> instructions before it, after it), and each
    part whose weight words an earlier part of the layer has into the third (layer index ->
    that part's layer, whose weight words it reads: :func:`share_words`).

    Double-buffered (:func:`_bands`), band ``k``'s windows are in slot ``k mod 2`` of each
    staging buffer (:func:`_slot`): after band ``k`` comes its STOREA, before band ``k + 1``
    the LOADAs of band ``k + 2``, and the DMA engine runs them while band ``k + 1``
    computes. The first transfer before band ``k + 1`` is a fence (dispatched once every
    transfer before it is done: the band's own LOADAs and the STOREA of band ``k - 1``,
    whose output slot band ``k + 1`` writes): the STOREA, else the next band's first LOADA,
    else a LOADA of no words. Before band 0 come the LOADAs of bands 0 and 1, and a fence
    after band 0's (every transfer before the layer done, its output slots free).
    Single-buffered, each band's LOADAs come before it and then a fence of no words, which
    also waits for the band before's STOREA."""
    before, after, owners = into
    config = emitter.config
    rows, out = config.rows, node.outputs[0]
    stage = (config.stage_in_depth, config.stage_out_depth)
    in_base, out_base = config.stage_bases
    out_shape = graph.types[out].shape
    full = {v: (natural_placement(0, ext.where[v][1], rows) if v in ext.where
                else placements[v]) for v in inputs}
    target = None if out in ext.where else placements[out]
    out_px = natural_placement(0, out_shape, rows)
    external = [v for v in inputs if v in ext.where]
    try:
        cuts, words, in_words, out_words, slots = _bands(
            node, graph, full, external, 0 if target is not None else out_px.width * out_px.cb,
            stage, _restreamed(emitter, node, graph, [full[v] for v in inputs]))
    except StageTooSmall:
        if (node.op not in ("QAvgPool", "QMaxPool") or out_shape[2:] != (1, 1)
                or not external or target is None):
            raise
        return _global_pool(emitter, node, full[external[0]], external[0], ext, into, target)
    offsets, offset = {}, 0
    for v, w in words.items():
        offsets[v], offset = offset, offset + w

    def loads(k: int) -> list:
        _, _, _, r0, r1 = cuts[k]
        base = _slot(in_base, stage[0], k % slots, in_words)
        records = []
        for v in words:
            whole = full[v]
            lo, hi = (0, 1) if whole.shape[2] == 1 else (r0, r1)
            window = _rows(whole, lo, hi, rows, base=base + offsets[v])
            records.append(Transfer(Op.LOADA, 0, window.words, window.base,
                                    ext.where[v][0] + lo * whole.shape[3] * whole.cb))
        return records

    plans, seen = [], ({}, {})
    for k, (o0, o1, band_node, r0, r1) in enumerate(cuts):
        _before(before, emitter.layer_count, k, len(cuts), slots, loads,
                bool(words and target is not None), in_base)
        sources = []
        for v in inputs:
            whole = full[v]
            lo, hi = (0, 1) if whole.shape[2] == 1 else (r0, r1)
            sources.append(_rows(whole, lo, hi, rows, base=_slot(
                in_base, stage[0], k % slots, in_words) + offsets[v]) if v in words
                else _rows(whole, lo, hi, rows))
        if target is None:
            band_target = _rows(out_px, o0, o1, rows,
                                base=_slot(out_base, stage[1], k % slots, out_words))
            store = Transfer(Op.STOREA, 1, band_target.words, band_target.base,
                             ext.where[out][0] + o0 * out_px.width * out_px.cb)
        else:
            band_target = _rows(target, o0, o1, rows)
        _emit(emitter, band_node, sources, band_target, seen, owners, plans)
        if target is None:
            after.setdefault(emitter.layer_count - 1, []).append(store)
    ext.stage = (max(ext.stage[0], slots * in_words), max(ext.stage[1], slots * out_words))
    return plans


def _before(before: dict, layer: int, k: int, count: int, slots: int, loads,
            fence_every: bool, in_base: int) -> None:
    """Put the transfers that come before cut ``k`` of ``count`` (layer ``layer``) into
    ``before``, the first to wait for the others a fence (:func:`band_layer`); ``loads(j)``
    makes cut ``j``'s LOADAs, ``fence_every``: a fence before every cut (it has LOADAs and no
    STOREA, whose own fence would do)."""
    if slots == 1:
        transfers = loads(k)
        fence = len(transfers)
    else:
        first = loads(0) if k == 0 else []
        transfers = first + (loads(k + 1) if k + 1 < count else [])
        fence = len(first) if k == 0 or fence_every else None
    if fence is not None:        # (else the STOREA before fences)
        if fence == len(transfers):
            transfers.append(Transfer(Op.LOADA, 0, 0, in_base, 0))
        transfers[fence] = replace(transfers[fence], fence=1)
    if transfers:
        before.setdefault(layer, []).extend(transfers)


def _emit(emitter, node: Node, sources: list, target: Placement, seen, owners: dict,
          plans: list) -> None:
    """Emit the cut ``node`` of a layer, its parts sharing the words of the layer's earlier
    parts (:func:`share_words`), and add their plans to ``plans``."""
    for emit in emitter.layer_parts(node, sources, target):
        wgt, par = emitter.weight_words, emitter.param_words
        plan = emit()
        plan.wgt_words, owner = share_words(emitter, seen, wgt, par)
        if owner is not None:
            owners[emitter.layer_count - 1] = owner
        plans.append(plan)


def _global_pool(emitter, node: Node, whole: Placement, value: str, ext: ExtTensors,
                 into: "tuple[dict, dict, dict]", target: Placement) -> list:
    """A pool of one output pixel (a global pool) on chip whose input ``value`` (in the
    external memory, ``whole``) does not fit the input staging buffer: in groups of its
    channel blocks, as many as fit a window twice (else once), each the pool over a copy of
    its channels writing their words of ``target`` (:func:`~.split.part_target`). The input
    is pixel-major, so a group's words come in one LOADA per pixel. Ordered and fenced as
    :func:`band_layer`'s bands. The groups do not share their weight and parameter words
    (:func:`share_words`): in groups or whole, the pool takes the same words of each buffer,
    so a board build's buffers, sized before it grows the staging buffers (which can make
    the pool whole), stay large enough (``fitting._sized_config``)."""
    before, _, owners = into
    config, rows, depth = emitter.config, emitter.config.rows, emitter.config.stage_in_depth
    in_base = config.stage_bases[0]
    _, channels, height, width = whole.shape
    pixels, cb = height * width, whole.cb
    slots = 2 if depth >= 2 * pixels else 1
    blocks = min(cb, depth // (slots * pixels))
    if not blocks:
        raise StageTooSmall(
            f"Layer '{node.name}' pools its input through the input staging buffer one channel "
            f"block at a time: it needs {pixels} words (stage_in_depth), the architecture has "
            f"{depth}", (pixels, 0))
    groups = [(b0, min(b0 + blocks, cb)) for b0 in range(0, cb, blocks)]
    in_words = blocks * pixels

    def loads(k: int) -> list:
        b0, b1 = groups[k]
        base = _slot(in_base, depth, k % slots, in_words)
        return [Transfer(Op.LOADA, 0, b1 - b0, base + p * (b1 - b0),
                         ext.where[value][0] + p * cb + b0) for p in range(pixels)]

    plans = []
    for k, (b0, b1) in enumerate(groups):
        c0, c1 = b0 * rows, min(channels, b1 * rows)
        _before(before, emitter.layer_count, k, len(groups), slots, loads, True, in_base)
        source = natural_placement(_slot(in_base, depth, k % slots, in_words),
                                   (1, c1 - c0, height, width), rows)
        _emit(emitter, replace(node, name=f"{node.name} [channels {c0}-{c1 - 1}]"), [source],
              part_target(target, c0, rows), ({}, {}), owners, plans)
    ext.stage = (max(ext.stage[0], slots * in_words), ext.stage[1])
    return plans


def share_words(emitter, seen: "tuple[dict, dict]", wgt_start: int, par_start: int
                ) -> "tuple[int, int | None]":
    """The last layer ``emitter`` emitted is a part of a band of a layer, its weight and
    parameter words from ``wgt_start`` and ``par_start``; ``seen`` maps the words of the
    layer's parts emitted before (weights, parameters) to where they are (and the weights'
    to the layer that holds them). Where its words are the same as some earlier part's (the
    same part of another band; a transposed convolution's phase, which bands starting at
    odd and even rows list in other orders), drop its copies and point its tiles at those
    (:meth:`~.emitter.TileEmitter.reuse_words`). Returns its weight words left, and the layer
    whose weights it reads (None: its own)."""
    wgt_words, par_words = emitter.words_since(wgt_start, par_start)
    wgt_at = par_at = owner = None
    if wgt_words and wgt_words in seen[0]:
        wgt_at, owner = seen[0][wgt_words]
    elif wgt_words:
        seen[0][wgt_words] = (wgt_start, emitter.layer_count - 1)
    if par_words and par_words in seen[1]:
        par_at = seen[1][par_words]
    elif par_words:
        seen[1][par_words] = par_start
    emitter.reuse_words(wgt_start, wgt_at, par_start, par_at)
    return emitter.weight_words - wgt_start, owner
