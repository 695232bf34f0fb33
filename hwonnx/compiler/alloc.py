"""Activation-buffer allocation: first fit, freeing a tensor after its last reader."""

from ..config import ArchConfig
from ..errors import ResourceError

__all__ = ["ActAllocator", "ActivationBufferFull"]


class ActivationBufferFull(ResourceError):
    """A tensor does not fit the free words of the activation buffer."""


class ActAllocator:
    def __init__(self, config: ArchConfig):
        self.depth = config.act_depth
        self.regions: "dict[str, tuple[int, int]]" = {}    # value -> (base, words)
        self.aliases: "dict[str, str]" = {}
        self.members: "dict[str, list[str]]" = {}           # root -> the values aliasing it
        self.high_water = 0

    def _root(self, value: str) -> str:
        while value in self.aliases:
            value = self.aliases[value]
        return value

    def alias(self, value: str, of: str) -> None:
        self.aliases[value] = of
        self.members.setdefault(self._root(of), []).append(value)

    def allocate(self, value: str, words: int, index: int, owner: str) -> int:
        """Place ``words`` words for ``value`` (``owner`` names it in errors:
        "Input 'x'" or "Layer 'conv1': its output")
        in the first free gap."""
        base = 0
        for start, size in sorted(self.regions.values()):
            if start - base >= words:
                break
            base = max(base, start + size)
        if base + words > self.depth:
            used = sum(size for _, size in self.regions.values())
            raise ActivationBufferFull(
                f"{owner} needs {words} activation words, but only "
                f"{self.depth - used} of {self.depth} are free ({used} hold live tensors); "
                f"raise --act-depth or use a larger board")
        self.regions[value] = (base, words)
        self.high_water = max(self.high_water, base + words)
        return base

    def free(self, value: str) -> None:
        """Free ``value``'s words now."""
        self.regions.pop(value, None)

    def release_dead(self, last_use: "dict[str, int]", index: int) -> None:
        """Free every tensor whose last reader is layer ``index`` or earlier (the readers of
        the values aliasing it included). Takes time in proportion to the live tensors, not
        to the whole model."""
        for value in list(self.regions):
            if all(last_use.get(v, -1) <= index for v in (value, *self.members.get(value, ()))):
                del self.regions[value]
