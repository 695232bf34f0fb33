"""Weights streamed from the external memory (``ArchConfig.ext_memory``): which layers keep
their weights in the weight buffer and which stream, where they go, and the LOADX
instructions that bring them in behind the computation (``docs/architecture.md``, "External
memory").

When a model's weight words do not fit the weight buffer, the largest layers stream until
the rest (resident, from word 0) and two slots as large as the largest streamed layer fit.
Streamed layer ``j`` (in program order) lives in slot ``j % 2``; its LOADX is issued right
after the last instruction of streamed layer ``j - 2``, the slot's previous user (the first
two at the start), so the copy overlaps the layers in between. Layers that read another's
words (the bands of a layer) count as one streamed layer with it when they run right after
it: they read its slot as it is. A LOADX is accepted only when
the DMA is idle and the weight loader has finished, so the LOADX after streamed layer
``j``'s own (or a LOADX of no words after the last) is also the fence that makes its words
visible to its LOADWs.

The parameters of the streamed layers stream with them: a LOADX reads its layers' parameter
words after their weights into a parameter slot of its own (``g % 2``, after the parameters
the other layers keep), so a model whose weights stream needs a parameter buffer of its
resident layers' words and two slots. Its POSTs are done before the LOADX is accepted (the
slot's previous user's have read their words), and the fence that makes the weights visible
makes the parameters visible to the POSTs too.
"""

from dataclasses import dataclass

from ..config import ArchConfig
from ..errors import ResourceError
from ..isa import EXT_WORDS_PER_PARAM, Op
from .loops import LayerTiles
from .micro import LoadX

__all__ = ["StreamPlan", "SlotTooSmall", "plan_streaming", "streamed_layers"]


class SlotTooSmall(ResourceError):
    """Two slots of the largest streamed layer do not fit the weight buffer; ``words``: the
    depth they need."""

    def __init__(self, message: str, words: int):
        super().__init__(message)
        self.words = words


@dataclass
class StreamPlan:
    wgt: "list[int]"              # the weight buffer's image: the resident layers' words
    ext: "list[int]"              # the external memory's image: the streamed layers' words
    words: int                    # weight-buffer words used: resident and both slots
    loadx: "dict[int, list[LoadX]]"    # LOADX instructions issued before layer index i
    streamed: "dict[int, int]"    # layer index -> the external words its LOADX streams
    par: "list[int]"              # the parameter buffer's image: the resident layers' words
    par_words: int                # parameter-buffer words used: resident and both slots


def streamed_layers(total: int, layer_words: "list[int]", names: "list[str]",
                    config: ArchConfig) -> "tuple[set[int], set[int]] | None":
    """The layers whose weights stay in the weight buffer and those that stream (the largest
    first, until the resident ones and two slots of the largest streamed fit
    ``config.wgt_depth``), of layers of ``layer_words`` (``total`` words in all); None when
    all fit or the architecture has no external memory. Raises :class:`SlotTooSmall` when
    two slots of a layer do not fit."""
    if not config.ext_memory or total <= config.wgt_depth:
        return None
    resident = {i for i, w in enumerate(layer_words) if w}
    streamed: "set[int]" = set()

    def needed() -> int:
        slot = max((layer_words[i] for i in streamed), default=0)
        return sum(layer_words[i] for i in resident) + 2 * slot

    while needed() > config.wgt_depth and resident:
        largest = max(resident, key=lambda i: (layer_words[i], -i))
        resident.discard(largest)
        streamed.add(largest)
    if needed() > config.wgt_depth:
        largest = max(streamed, key=lambda i: layer_words[i])
        raise SlotTooSmall(f"Layer '{names[largest]}' has {layer_words[largest]} weight "
                            f"words; streaming it from the external memory takes two slots "
                            f"of that size, more than the {config.wgt_depth} words of the "
                            f"weight buffer; raise --wgt-depth or use a larger array",
                            2 * layer_words[largest])
    return resident, streamed


def plan_streaming(wgt: "list[int]", par: "list[int]", layer_words: "list[int]",
                   layers: "list[LayerTiles]", names: "list[str]", config: ArchConfig,
                   owners: "dict[int, int] | None" = None) -> "StreamPlan | None":
    """Stream the layers whose weights do not fit ``config.wgt_depth`` (None when all fit or
    the architecture has no external memory), and their parameters (words of ``par``, the
    parameter buffer's image); relocates the weight and parameter addresses of every tile
    in ``layers`` (each layer's words are ``layer_words[i]`` consecutive words of ``wgt``, in
    layer order; a layer of ``owners`` has none, it reads those of the layer it maps to:
    in place if that layer's are resident, else from a copy streamed into a slot for it)."""
    chosen = streamed_layers(len(wgt), layer_words, names, config)
    if chosen is None:
        return None
    resident, streamed = chosen
    owners = owners or {}
    starts = [sum(layer_words[:i]) for i in range(len(layer_words))]
    slot = max(layer_words[i] for i in streamed)
    base, image = {}, []
    for i in sorted(resident):
        base[i] = len(image)
        image += wgt[starts[i]:starts[i] + layer_words[i]]
    # a layer reading a streamed layer's words gets a copy of them in a slot of its own,
    # unless it runs right after the owner (or another such reader): the bands of a layer
    # of one part share the slot and its one copy
    copies = {i: owner for i, owner in owners.items() if owner in streamed}
    groups: "list[list[int]]" = []      # streamed layers in order, by slot and copy
    for i in sorted(streamed | set(copies)):
        if groups and copies.get(groups[-1][0], groups[-1][0]) == copies.get(i, i):
            groups[-1].append(i)
        else:
            groups.append([i])
    words = {group[0]: layer_words[copies.get(group[0], group[0])] for group in groups}
    ext, ext_addr = [], {}
    for g, group in enumerate(groups):
        for i in group:
            base[i] = len(image) + (g % 2) * slot
        i = group[0]
        if i in copies:             # the owner comes first
            ext_addr[i] = ext_addr[copies[i]]
            continue
        ext_addr[i] = len(ext)
        ext += wgt[starts[i]:starts[i] + layer_words[i]]
    par_image, par_words, par_loads = _stream_params(par, groups, layers, ext,
                                                     config.cols)
    if len(ext) > config.ext_depth:
        raise ResourceError(f"The streamed weights take {len(ext)} words of the external "
                            f"memory, but the {config.name} architecture has "
                            f"{config.ext_depth} (ext_depth)")
    for i, layer in enumerate(layers):
        owner = owners.get(i, i)
        shift = base.get(i if i in copies else owner, 0) - starts[owner]
        for tile in layer.tiles if shift else ():
            tile.matmul = tile.matmul.moved(wgt_addr=tile.matmul.wgt_addr + shift)

    loadx: "dict[int, list[LoadX]]" = {}

    def issue(before_layer: int, fields: dict) -> None:
        loadx.setdefault(before_layer, []).append(LoadX(**fields))

    for g, group in enumerate(groups + [None]):
        where = 0 if g < 2 else groups[g - 2][-1] + 1
        i = None if group is None else group[0]
        issue(where, dict(count=0, wgt_addr=0, ext_addr=0) if i is None else dict(
            count=words[i], wgt_addr=base[i], ext_addr=ext_addr[i], **par_loads[g]))
    streamed_words = {i: words[i] + par_loads[g]["par_count"]
                      for g, group in enumerate(groups) for i in group[:1]}
    return StreamPlan(image, ext, len(image) + 2 * slot, loadx, streamed_words, par_image,
                      par_words)


def _posts(layer: LayerTiles):
    """The POSTs of ``layer``: its tiles', or its stored records'."""
    for tile in layer.tiles:
        yield from tile.posts
    for record in layer.records or []:
        if record.op == Op.POST:
            yield record


def _stream_params(par: "list[int]", groups: "list[list[int]]", layers: "list[LayerTiles]",
                   ext: "list[int]", cols: int) -> "tuple[list[int], int, list[dict]]":
    """Parameter slots for the streamed ``groups`` of layers (as their weights'): the words
    the other layers' POSTs read stay in the buffer, in order, from word 0; group ``g``'s
    words (those its POSTs read, in order) go into slot ``g % 2`` after them, from a copy
    appended to ``ext`` (one per distinct set of words) as EXT_WORDS_PER_PARAM words each,
    least significant first. Points every POST at its word's new place; returns the buffer's
    image, the words it needs with both slots, and each group's LOADX fields."""
    in_group = {i for group in groups for i in group}
    kept = sorted({post.par_addr for i, layer in enumerate(layers) if i not in in_group
                   for post in _posts(layer)})
    reads = [sorted({post.par_addr for i in group for post in _posts(layers[i])})
             for group in groups]
    slot = max(map(len, reads), default=0)
    moved: "set[int]" = set()         # the layers whose POSTs point at their new words

    def point(index: int, where: "dict[int, int]") -> None:
        assert index not in moved, "a layer's POSTs pointed twice"
        moved.add(index)
        layer = layers[index]

        def pointed(post):
            return post.moved(par_addr=where[post.par_addr])

        for tile in layer.tiles:
            tile.posts = [pointed(post) for post in tile.posts]
        if layer.records is not None:
            layer.records = [pointed(record) if record.op == Op.POST else record
                             for record in layer.records]

    for i, layer in enumerate(layers):
        if i not in in_group:
            point(i, {a: k for k, a in enumerate(kept)})
    mask, copies, loads = (1 << (8 * cols)) - 1, {}, []
    for g, (group, read) in enumerate(zip(groups, reads)):
        start = len(kept) + (g % 2) * slot
        for i in group:
            point(i, {a: start + k for k, a in enumerate(read)})
        if tuple(read) not in copies:
            copies[tuple(read)] = len(ext)
            ext += [(par[a] >> (8 * cols * j)) & mask for a in read
                    for j in range(EXT_WORDS_PER_PARAM)]
        loads.append(dict(par_count=len(read) * EXT_WORDS_PER_PARAM, par_addr=start,
                          par_ext=copies[tuple(read)]))
    return [par[a] for a in kept], len(kept) + 2 * slot, loads
