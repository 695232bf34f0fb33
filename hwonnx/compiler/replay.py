"""How the lowerings of one graph ended (:class:`Lowerings`), for a sizing that lowers it
again and again with other buffer depths (``fitting._sized_config``): a lowering whose
layers would be emitted as in an earlier one fails as it failed, or gets its program, without
emitting them again."""

from dataclasses import fields

from ..config import ArchConfig
from .program import Program
from .stream import streamed_layers

__all__ = ["READ_AFTER", "Lowerings"]

#: Architecture fields that a lowering whose layers do not run in parts (:mod:`.split` reads
#: ``wgt_depth``) reads only after every layer is emitted (the weight streaming, the buffer
#: checks, the paging); and ``lut_tables``, which the layers read only to refuse a table
#: beyond it.
READ_AFTER = frozenset({"wgt_depth", "par_depth", "prog_depth", "prog_page", "ext_depth",
                        "lut_tables"})


class Lowerings:
    """How the lowerings of one graph ended. A lowering whose layers are emitted as in an
    earlier one (the same inputs packed and tensors outside, the same ``split``, every
    architecture field but :data:`READ_AFTER` the same, and ``wgt_depth`` too when it
    succeeded or ran in parts; activation tables enough for those that the earlier one's
    layers took):

    - fails as it did, where that failed not in parts: the activation buffer full at the
      same layer, or, every layer emitted, two slots of the same layer's weights not fitting
      the weight buffer, as :func:`~.stream.streamed_layers` decides again for the new depth
      (when they fit, the lowering runs);
    - has its program (:meth:`program`), where that succeeded: the same instructions and
      images, for the new architecture, which ``lower`` checks again."""

    def __init__(self):
        self._failed: "dict[tuple, tuple]" = {}
        self._done: "dict[tuple, Program]" = {}
        #: What the tile emitters of these lowerings share: each layer's weight tiles,
        #: sums and packing, by its weights (:class:`~.emitter.TileEmitter`).
        self.emitters: dict = {}

    @staticmethod
    def _key(config: ArchConfig, loops: bool, packed, external) -> tuple:
        return (loops, tuple(packed), external,
                tuple(getattr(config, f.name) for f in fields(config)
                      if f.name not in READ_AFTER))

    def replay(self, config: ArchConfig, loops: bool, packed, external) -> None:
        """Raise the failure of a lowering (not in parts) like this one's, if one failed."""
        failed = self._failed.get(self._key(config, loops, packed, external))
        if failed is None or config.lut_tables < failed[0]:
            return
        tables, error, streaming = failed
        if streaming is None:
            raise error
        streamed_layers(*streaming, config)

    def record(self, config: ArchConfig, loops: bool, packed, external, tables: int,
               error: Exception, streaming: "tuple | None" = None) -> None:
        """A lowering not in parts failed with ``error`` after its layers took ``tables``
        activation tables; ``streaming``: the weight words (all, per layer) and the layers'
        names when it failed for want of slots."""
        self._failed[self._key(config, loops, packed, external)] = (tables, error, streaming)

    def program(self, config: ArchConfig, loops: bool, packed, external, split: bool
                ) -> "Program | None":
        """The program (unpaged, for its own architecture) of an earlier lowering like this
        one that succeeded and took at most ``config.lut_tables`` tables; else None."""
        done = self._done.get((self._key(config, loops, packed, external), split,
                               config.wgt_depth))
        if done is None or len(done.images.get("lut", ())) > 256 * config.lut_tables:
            return None
        return done

    def keep(self, program: Program, loops: bool, packed, external, split: bool) -> None:
        """A lowering succeeded with ``program`` (unpaged)."""
        self._done[self._key(program.config, loops, packed, external), split,
                   program.config.wgt_depth] = program
