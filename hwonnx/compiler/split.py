"""Layers whose weights are too many for a streamed slot (``ArchConfig.ext_memory``): the
layer runs as *parts*, each a group of its output channels with its own weights, so that each
part's weights stream on their own (:mod:`.stream`). A part is the layer's spec restricted to
its channels (:func:`part_spec`) writing a view of the output that starts at its first
channel's word (:func:`part_target`): parts start at multiples of the words' lanes, so every
part's posts write whole lanes of their own words and the parts together write each word
once per lane.

The compiler splits only when a layer's weights whole do not stream (two slots of them do not
fit the weight buffer: :class:`~.stream.SlotTooSmall`), and then every layer whose weights
exceed :func:`part_budget`; without an external memory a layer is one part. A channel
concatenation runs as one part per source whenever the sources start at whole words
(:func:`concat_parts`), so that each part is one looped nest."""

from dataclasses import replace
from math import lcm

import numpy as np

from ..config import ArchConfig
from ..hdl.loader import tile_words
from .digest import digest, remember
from .layout import Placement
from .specs import LayerSpec

__all__ = ["part_budget", "words_per_group", "weight_parts", "concat_parts", "part_spec",
           "part_target"]


def part_budget(config: ArchConfig) -> int:
    """Weight words a part may take: a quarter of the weight buffer, so that the two slots
    of the streamed layers (:mod:`.stream`) leave half of it to the resident ones."""
    return config.wgt_depth // 4


def words_per_group(spec: LayerSpec, config: ArchConfig) -> int:
    """Weight words of one N tile of ``spec`` (``cols`` output channels), at most: every K
    tile kept (a dense layer keeps them all), in 8-bit packing."""
    kh, kw = spec.phys.shape[1:3]
    blocks = sum(source.cb for source in spec.sources)
    return kh * kw * blocks * tile_words(config, 0)


def weight_parts(spec: LayerSpec, config: ArchConfig) -> "list[tuple[int, int]]":
    """The output channels ``[c0, c1)`` of each part of the layer ``spec``: one part unless the
    architecture has an external memory and the layer's weights exceed :func:`part_budget`;
    then groups of whole N tiles (and whole words: multiples of ``lcm(rows, cols)``
    channels), as many per part as the budget holds, at least one group."""
    channels = spec.phys.shape[0]
    if (not config.ext_memory or spec.depthwise or spec.scatter is not None
            or spec.counts is not None or spec.pool_max):
        return [(0, channels)]
    step = lcm(config.rows, config.cols)
    per_group = words_per_group(spec, config) * (step // config.cols)
    if -(-channels // step) * per_group <= part_budget(config):
        return [(0, channels)]
    width = step * max(1, part_budget(config) // per_group)
    return [(c0, min(c0 + width, channels)) for c0 in range(0, channels, width)]


def concat_parts(spec: LayerSpec, rows: int) -> "list[tuple[int, int]] | None":
    """The output channels ``[c0, c1)`` of each source of a channel concatenation ``spec``
    (a 1x1 convolution with one weight per output channel), when each starts at a multiple
    of ``rows``: a part reads one source, so its N tiles step through that source's words by
    a constant and the part is one looped nest, where the whole layer's tiles jump from
    source to source. None otherwise."""
    lanes = spec.phys[:, 0, 0, :].argmax(axis=1)
    source = np.searchsorted(spec.offsets, lanes, side="right") - 1
    starts = [0] + [c for c in range(1, len(source)) if source[c] != source[c - 1]]
    if len(starts) == 1 or any(c % rows for c in starts):
        return None
    return list(zip(starts, starts[1:] + [len(source)]))


def part_spec(spec: LayerSpec, c0: int, c1: int) -> LayerSpec:
    """``spec`` restricted to its output channels ``[c0, c1)`` (of read-only physical
    weights: a view whose digest is theirs and the channels, :func:`~.digest.remember`)."""
    channels, phys = spec.phys.shape[0], spec.phys[c0:c1]
    if not spec.phys.flags.writeable:
        remember(phys, ("part", digest(spec.phys), c0, c1))
    return replace(spec, phys=phys, bias=spec.bias[c0:c1], mult=spec.mult[c0:c1],
                   shift=spec.shift[c0:c1], macs=spec.macs * (c1 - c0) // channels)


def part_target(target: Placement, c0: int, rows: int) -> Placement:
    """The output ``target`` seen from channel ``c0`` (a multiple of ``rows``) on: its words
    per pixel stay the pixel stride, so channel ``c`` of the part is channel ``c0 + c``."""
    return replace(target, base=target.base + c0 // rows)
