"""Typed micro-instructions: what the lowering builds before a program stores it.

Each class holds the fields of one kind of instruction (:data:`hwonnx.isa.FIELDS`, the ELTW
and transfer layouts), frozen; a field left None is not set, and :meth:`fields` gives the
instruction's fields, in order, as :class:`~.program.Instr` stores them (unset ones encode as
0). An address that moves later (a shared weight tile, a streamed parameter word, the
external memory's activation region) makes a new record with :meth:`_Record.moved`."""

from dataclasses import MISSING, dataclass, fields as dataclass_fields

from ..isa import Op

__all__ = ["LoadW", "MatMul", "Post", "Eltw", "Transfer", "LoadX", "layout"]

_Int = "int | None"


class _Record:
    """The instruction's fields: every one that is set, in declaration order."""

    @classmethod
    def of(cls, **values: int) -> "_Record":
        """``cls(**values)``, the fields stored at once (the frozen dataclass's ``__init__``
        sets them one ``object.__setattr__`` each: 2-3x slower, on the millions of tiles
        the emitter makes)."""
        names, defaults, required = layout(cls)
        record = object.__new__(cls)
        record.__dict__.update(defaults, **values)
        if len(record.__dict__) > len(names) or (required and any(
                record.__dict__[name] is _REQUIRED for name in required)):
            raise TypeError(f"{cls.__name__}.of() takes the fields {', '.join(names)} "
                            f"({', '.join(required) or 'none'} required), not "
                            f"{', '.join(sorted(values))}")
        return record

    def moved(self, **changes: int) -> "_Record":
        """A copy with ``changes``: :func:`dataclasses.replace` without running ``__init__``
        again (the records only store their fields), for the addresses that move on
        millions of tiles."""
        record = object.__new__(type(self))
        record.__dict__.update(self.__dict__, **changes)
        return record

    def fields(self) -> "dict[str, int]":
        values = self.__dict__
        return {name: values[name] for name in layout(type(self))[0]
                if values[name] is not None}


_REQUIRED = object()        # a field without a default


def layout(cls: type) -> "tuple[tuple[str, ...], dict[str, object], tuple[str, ...]]":
    """The field names of record class ``cls`` in declaration order, each field's default
    (:data:`_REQUIRED`: none) and the fields without one, looked up once."""
    layout = _LAYOUTS.get(cls)
    if layout is None:
        fields = dataclass_fields(cls)
        layout = _LAYOUTS[cls] = (
            tuple(f.name for f in fields),
            {f.name: _REQUIRED if f.default is MISSING else f.default for f in fields},
            tuple(f.name for f in fields if f.default is MISSING))
    return layout


_LAYOUTS: "dict[type, tuple]" = {}


@dataclass(frozen=True)
class LoadW(_Record):
    """One LOADW: the weight tile at ``wgt_addr`` into weight bank ``bank``."""
    bank: int
    wgt_addr: int
    wpack: int
    op: int = Op.LOADW

    def fields(self) -> "dict[str, int]":
        return {"op": self.op, "bank": self.bank, "wgt_addr": self.wgt_addr,
                "wpack": self.wpack}


@dataclass(frozen=True)
class MatMul(_Record):
    """One MATMUL of a tile: ``dw``, ``vstride`` and ``vlast`` for depthwise streaming,
    ``pool_max`` otherwise; its weight ``bank`` is unset until the schedule
    (:func:`~.loops.schedule`) assigns it."""
    op: int = Op.MATMUL
    wait: _Int = None
    first: _Int = None
    count: _Int = None
    wgt_addr: _Int = None
    acc_addr: _Int = None
    act_addr: _Int = None
    act_row: _Int = None
    ow: _Int = None
    ox0: _Int = None
    ih: _Int = None
    iw: _Int = None
    iy0: _Int = None
    ix0: _Int = None
    ixr: _Int = None
    sy: _Int = None
    sx: _Int = None
    step_x: _Int = None
    step_y: _Int = None
    zp: _Int = None
    pool_max: _Int = None
    dw: _Int = None
    vstride: _Int = None
    vlast: _Int = None
    wpack: _Int = None
    bank: _Int = None


@dataclass(frozen=True)
class Post(_Record):
    """One POST: requantize ``count`` accumulator words into activation words."""
    op: int = Op.POST
    acc_addr: _Int = None
    count: _Int = None
    par_addr: _Int = None
    out_addr: _Int = None
    out_stride: _Int = None
    nw: _Int = None
    lane_off: _Int = None
    nt: _Int = None
    zp: _Int = None
    lo: _Int = None
    hi: _Int = None
    rne: _Int = None
    lut: _Int = None


@dataclass(frozen=True)
class Eltw(_Record):
    """One ELTW of the element-wise engine (``isa.ELTW_FIELDS``)."""
    op: int = Op.ELTW
    mode: _Int = None
    mul: _Int = None
    ka: _Int = None
    kb: _Int = None
    za: _Int = None
    zb: _Int = None
    a_stride: _Int = None
    b_stride: _Int = None
    wait: _Int = None
    count: _Int = None
    acc_addr: _Int = None
    a_addr: _Int = None
    b_addr: _Int = None


@dataclass(frozen=True)
class Transfer(_Record):
    """One LOADA or STOREA of the DMA engine: ``count`` words between the activation
    address space and the external memory; ``fence``: dispatched once every transfer before
    it is done."""
    op: int
    fence: int
    count: int
    act_addr: int
    ext_addr: int


@dataclass(frozen=True)
class LoadX(_Record):
    """One LOADX of the DMA engine: ``count`` weight words from external word ``ext_addr``
    into the weight buffer at ``wgt_addr``, and ``par_count`` parameter words from
    ``par_ext`` at ``par_addr`` (:mod:`.stream`)."""
    count: int
    wgt_addr: int
    ext_addr: int
    par_count: _Int = None
    par_addr: _Int = None
    par_ext: _Int = None
    op: int = Op.LOADX

    def fields(self) -> "dict[str, int]":
        return {"op": self.op, **{k: v for k, v in super().fields().items() if k != "op"}}
