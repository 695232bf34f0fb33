"""Where tensors live in the activation buffer, and host-side packing of words.

A tensor is stored pixel-major: pixel ``(y, x)`` occupies ``cb = ceil(C / rows)`` consecutive
words, channel ``c`` in word ``c // rows``, lane ``c % rows``. ``logical`` maps every physical
lane (word-major) to the flat C-order index of the value in the tensor's logical shape, or -1
for a padding lane (which the host writes as ``fill``, 0 but for a packed input); Flatten and
Reshape only change the logical shape, never the memory. A graph input read by one convolution
may be *packed* for it instead (:mod:`.taps`): its logical indices repeat.
"""

from dataclasses import dataclass, field, replace

import numpy as np

__all__ = ["Placement", "natural_placement", "layout_view", "pack_words", "unpack_words"]


@dataclass(frozen=True)
class Placement:
    base: int
    height: int
    width: int
    cb: int                              # words per pixel
    shape: "tuple[int, ...]"             # logical shape, batch 1 first
    logical: np.ndarray = field(repr=False, compare=False)   # [words * rows] -> index or -1
    fill: int = 0                        # what the host writes into the lanes of index -1
    packed: bool = False                 # a graph input packed for its convolution (taps.py)
    #: ``"act"``: ``base`` is a word of the activation buffer; ``"ext"``: of the external
    #: memory (a graph input or output too large for the buffer: :mod:`.spill`)
    memory: str = "act"

    @property
    def words(self) -> int:
        return self.height * self.width * self.cb

    def with_shape(self, shape: "tuple[int, ...]") -> "Placement":
        return replace(self, shape=tuple(shape))

    def is_natural_image(self, rows: int) -> bool:
        """Whether the logical ``[1, C, H, W]`` shape matches the pixel-major layout."""
        if len(self.shape) != 4:
            return False
        _, c, h, w = self.shape
        if (h, w) != (self.height, self.width) or self.cb != -(-c // rows):
            return False
        return np.array_equal(self.logical, _natural_index(c, h, w, rows))


def _natural_index(channels: int, height: int, width: int, rows: int) -> np.ndarray:
    """The ``logical`` of a ``[1, C, H, W]`` tensor in its natural layout: lane ``c`` of
    pixel ``p = y W + x`` holds element ``c H W + p`` (-1 past the channels). Read-only,
    and kept for the next placements of the shape (:data:`_NATURAL`: the bands of the
    tensors in the external memory, :mod:`.spill`, place the same shapes thousands of
    times in a lowering)."""
    key = (channels, height, width, rows)
    index = _NATURAL.get(key)
    if index is None:
        lanes = np.arange(-(-channels // rows) * rows)
        index = np.add.outer(np.arange(height * width), lanes * (height * width))
        index[:, lanes >= channels] = -1
        index = index.reshape(-1)
        index.flags.writeable = False
        global _natural_bytes
        while _NATURAL and _natural_bytes + index.nbytes > _NATURAL_BYTES:
            _natural_bytes -= _NATURAL.pop(next(iter(_NATURAL))).nbytes
        _NATURAL[key] = index
        _natural_bytes += index.nbytes
    return index


#: The natural layouts made so far (:func:`_natural_index`), the oldest dropped beyond
#: :data:`_NATURAL_BYTES`.
_NATURAL: "dict[tuple[int, int, int, int], np.ndarray]" = {}
_NATURAL_BYTES = 32 << 20
_natural_bytes = 0


def natural_placement(base: int, shape: "tuple[int, ...]", rows: int) -> Placement:
    """Placement of a ``[1, C, H, W]`` or ``[1, K]`` tensor in its natural layout."""
    if len(shape) == 4:
        _, c, h, w = shape
    elif len(shape) == 2:
        c, h, w = shape[1], 1, 1
    else:
        raise ValueError(f"Cannot place a tensor of shape {shape}")
    return Placement(base, h, w, -(-c // rows), tuple(shape), _natural_index(c, h, w, rows))


def layout_view(placement: Placement, shape: "tuple[int, ...]", rows: int) -> Placement:
    """The placement of a ``Reshape``/``Flatten`` of ``placement`` to ``shape``: the same words
    with the new logical shape, and, where the new shape is a ``[1, C, H, W]`` image whose
    natural layout holds every element in the lane it is in (a ``[1, C, h, w]`` image
    relabelled ``[1, C, h w, 1]``, the pixels in the same order: a vision transformer's patch
    tokens), that image's placement: a free view the layers read as the image it is."""
    view = placement.with_shape(shape)
    if len(shape) != 4 or placement.packed or placement.memory != "act" \
            or view.is_natural_image(rows):
        return view
    natural = natural_placement(placement.base, shape, rows)
    if natural.words == placement.words and np.array_equal(natural.logical, placement.logical):
        return replace(natural, fill=placement.fill)
    return view


def pack_words(values: np.ndarray, placement: Placement, rows: int) -> "list[int]":
    """Pack one sample's int8 tensor (logical shape) into activation words."""
    flat = np.asarray(values, dtype=np.int8).reshape(-1)
    lanes = np.full(placement.logical.shape, placement.fill, dtype=np.int8).view(np.uint8)
    valid = placement.logical >= 0
    lanes[valid] = flat[placement.logical[valid]].view(np.uint8)
    return _lanes_to_words(lanes.reshape(-1, rows))


def unpack_words(words: "list[int]", placement: Placement, rows: int) -> np.ndarray:
    """Inverse of :func:`pack_words`: activation words -> int8 tensor of the logical shape."""
    lanes = _words_to_lanes(words, rows).reshape(-1)
    out = np.zeros(int(np.prod(placement.shape)), dtype=np.int8)
    valid = placement.logical >= 0
    out[placement.logical[valid]] = lanes[valid].view(np.int8)
    return out.reshape(placement.shape)


def _lanes_to_words(lanes: np.ndarray) -> "list[int]":
    data = np.ascontiguousarray(lanes, dtype=np.uint8)
    return [int.from_bytes(row.tobytes(), "little") for row in data]


def _words_to_lanes(words: "list[int]", lanes: int) -> np.ndarray:
    raw = b"".join(int(w).to_bytes(lanes, "little") for w in words)
    return np.frombuffer(raw, dtype=np.uint8).reshape(len(words), lanes)
