"""A key of an array's contents (:func:`digest`), hashed once for a read-only array: the
physical weights of a layer (``specs._conv_phys``), which the tile emitter reads again for
each band of the layer in the external memory (:mod:`.spill`) and each lowering of a
sizing."""

import hashlib

import numpy as np

__all__ = ["digest"]

#: Read-only arrays whose digests :func:`digest` keeps.
_DIGEST_CACHE = 64


def digest(array: np.ndarray) -> tuple:
    """A key of ``array``'s shape, type and contents: hashed once for a read-only array
    (the physical weights of a layer's bands, ``specs._conv_phys``, and their views) while
    it lives (:data:`_DIGESTS` holds it, so its memory is not another's meanwhile)."""
    where = (array.__array_interface__["data"][0], array.shape, array.strides,
             array.dtype.str)
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
