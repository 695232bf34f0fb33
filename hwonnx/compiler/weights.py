"""Weight tiles in the weight buffer.

A layer's tiles are stored in the narrowest packing the loader unpacks
(:data:`hwonnx.hdl.loader.WEIGHT_PACKINGS`) that holds every weight of the layer: a layer
whose integer weights all lie in [-8, 7] (4-bit, from a QONNX ``Quant`` of 4 bits or a pooling
window of ones) takes half the words of an 8-bit one, and one in [-2, 1] (2-bit, bipolar) a
quarter. The packing follows the values, so it is exact whatever the model's source, and the
loader's timing is the same for every packing (:func:`hwonnx.hdl.loader.load_cycles`).
"""

import numpy as np

from ..config import ArchConfig
from ..hdl.loader import WEIGHT_PACKINGS, tile_words

__all__ = ["layer_wpack", "weight_bits", "pack_tile", "pack_tiles", "unpack_tile"]


def weight_bits(wpack: int) -> int:
    """Bits of one weight in packing ``wpack``."""
    return 8 >> wpack


def layer_wpack(weights: np.ndarray) -> int:
    """The packing of a layer whose integer weights are ``weights`` (any shape)."""
    lo, hi = (int(weights.min()), int(weights.max())) if weights.size else (0, 0)
    for wpack in sorted(WEIGHT_PACKINGS, reverse=True):
        half = 1 << (weight_bits(wpack) - 1)
        if -half <= lo and hi < half:
            return wpack
    raise ValueError(f"weights from {lo} to {hi} do not fit int8")


def pack_tile(tile: np.ndarray, wpack: int) -> "list[int]":
    """The weight words of one tile: ``tile[r, c]`` is the weight of array row ``r``,
    column ``c`` (``rows x cols``)."""
    return pack_tiles(tile[np.newaxis], wpack)


def pack_tiles(tiles: np.ndarray, wpack: int) -> "list[int]":
    """The weight words of tiles ``tiles[t]`` (:func:`pack_tile`), one tile after the other:
    packed together (the tiles of a layer: thousands of them)."""
    count, rows, cols = tiles.shape
    per, bits = 1 << wpack, weight_bits(wpack)
    padded = np.zeros((count, -(-rows // per) * per, cols), dtype=np.int64)
    padded[:, :rows] = tiles
    fields = (padded & ((1 << bits) - 1)).reshape(count, -1, per, cols)
    lanes = sum(fields[:, :, slot, :] << (slot * bits) for slot in range(per))
    lane_bytes = lanes.astype(np.uint8).reshape(-1, cols)      # a word's lanes, lane 0 first
    if cols <= 8:       # each word one little-endian 64-bit integer
        wide = np.zeros((len(lane_bytes), 8), dtype=np.uint8)
        wide[:, :cols] = lane_bytes
        return wide.view("<u8").ravel().tolist()
    return [int.from_bytes(word.tobytes(), "little") for word in lane_bytes]


def unpack_tile(words: "list[int]", wpack: int, config: ArchConfig) -> np.ndarray:
    """The ``rows x cols`` weights of the tile stored in ``words`` (as the loader reads
    them)."""
    rows, cols = config.rows, config.cols
    if len(words) != tile_words(config, wpack):
        raise ValueError(f"a tile of packing {wpack} is {tile_words(config, wpack)} words, "
                         f"not {len(words)}")
    per, bits = 1 << wpack, weight_bits(wpack)
    lanes = np.array([list(w.to_bytes(cols, "little")) for w in words], dtype=np.int64)
    fields = np.stack([(lanes >> (slot * bits)) & ((1 << bits) - 1) for slot in range(per)],
                      axis=1).reshape(-1, cols)[:rows]
    return np.where(fields >= 1 << (bits - 1), fields - (1 << bits), fields)

