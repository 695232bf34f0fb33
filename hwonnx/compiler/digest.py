"""A key of an array's contents (:func:`digest`), hashed once for a read-only array: the
physical weights of a layer (``specs._conv_phys``), which the tile emitter reads again for
each band of the layer in the external memory (:mod:`.spill`) and each lowering of a
sizing."""

import hashlib

import numpy as np

__all__ = ["digest", "remember"]

#: Read-only arrays whose digests :func:`digest` keeps.
_DIGEST_CACHE = 64


def digest(array: np.ndarray) -> tuple:
    """A key of ``array``'s shape, type and contents: hashed once for a read-only array
    (the physical weights of a layer's bands, ``specs._conv_phys``, and their views) while
    it lives (:data:`_DIGESTS` holds it, so its memory is not another's meanwhile)."""
    where = _where(array)
    known = _DIGESTS.get(where)
    if known is not None:
        return known[1]
    key = (hashlib.blake2b(np.ascontiguousarray(array)).digest(), array.shape,
           array.dtype.str)
    owner = array if array.base is None else array.base
    if not array.flags.writeable and isinstance(owner, np.ndarray) \
            and not owner.flags.writeable:
        if len(_DIGESTS) >= _DIGEST_CACHE:
            del _DIGESTS[next(iter(_DIGESTS))]
        _DIGESTS[where] = (owner, key)
    return key


_DIGESTS: "dict[tuple, tuple[np.ndarray, tuple]]" = {}


def remember(array: np.ndarray, made_of: tuple) -> None:
    """Take ``(made_of, shape, type)`` as the digest of the read-only ``array`` while it
    lives, where ``made_of`` determines its contents (the physical weights of a
    convolution: its weights' digest, groups and lanes, 8 to 64 times fewer bytes to hash
    for each lowering of a sizing that makes them again). Another array of the same
    contents may have another digest: a cache keyed by digests then misses, never errs."""
    if array.flags.writeable:
        raise ValueError("remember() takes a read-only array")
    if len(_DIGESTS) >= _DIGEST_CACHE:
        del _DIGESTS[next(iter(_DIGESTS))]
    _DIGESTS[_where(array)] = (array, (made_of, array.shape, array.dtype.str))


def _where(array: np.ndarray) -> tuple:
    """Where ``array``'s elements are: its first byte, shape, strides and type."""
    return (array.__array_interface__["data"][0], array.shape, array.strides,
            array.dtype.str)
