"""A compiled program: the instructions, memory images and placements of one model for one
architecture (:class:`Program`), what the dispatcher issues for it (:meth:`Program.expanded`)
and its program-memory words (:func:`encode_program`). A program cut after a layer is
:func:`hwonnx.compiler.paging.truncated` (it pages the cut program again)."""

from dataclasses import dataclass, field
from types import MappingProxyType

from ..config import ArchConfig
from ..errors import ResourceError
from ..isa import Op, encode
from .layout import Placement
from .loops import expand

__all__ = ["Instr", "LayerPlan", "Port", "Program", "encode_program", "encode_instructions",
           "mark_layers"]


@dataclass(frozen=True)
class Instr:
    """One instruction: the fields it encodes (``op`` and the fields of its layout,
    :func:`hwonnx.isa.fields_of`; unset ones encode as 0), and as metadata, not encoded, the
    index of its ``layer`` and whether the tile walker issues it (``looped``).
    ``instr["count"]`` and ``instr.get("dw")`` read fields; ``fields`` is a read-only copy of
    the mapping given (an instruction never changes: :meth:`Program.cached`)."""
    fields: "MappingProxyType[str, int]"
    layer: int
    looped: bool = False

    def __post_init__(self):
        object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))

    @property
    def op(self) -> int:
        return self.fields["op"]

    def __getitem__(self, name: str) -> int:
        return self.fields[name]

    def get(self, name: str, default=None):
        return self.fields.get(name, default)

    @classmethod
    def walked(cls, fields: "dict[str, int]", layer: int) -> "Instr":
        """An instruction the walker issues (``looped``), whose ``fields`` no one else holds:
        made read-only without a copy, and without the frozen dataclass's ``__init__`` (a
        program expands to millions of them)."""
        instr = object.__new__(cls)
        instr.__dict__.update(fields=MappingProxyType(fields), layer=layer, looped=True)
        return instr


@dataclass
class LayerPlan:
    """One array layer (QConv or QDense) and the instructions that compute it."""
    name: str
    op: str
    output: str
    macs: int
    first: int = 0          # index of its first stored instruction
    last: int = 0           # index of its last stored instruction (inclusive)
    tiles: int = 0
    wgt_words: int = 0      # words of the weight buffer its weight tiles take
    wgt_bits: int = 8       # bits per stored weight (hwonnx.compiler.weights: its packing)
    ext_words: int = 0      # words its weights and parameters stream from the external
    #                         memory (.stream)


@dataclass(frozen=True)
class Port:
    """One input or output of the accelerator: the int8 ``value`` the host writes (an input,
    the output of its ``Quantize``) or reads (an output, the input of its ``Dequantize``),
    and ``name``, the float value on the host side of that conversion (the ``Quantize``'s
    input, the ``Dequantize``'s output)."""
    name: str
    value: str


@dataclass(frozen=True)
class Program:
    """Everything the accelerator needs to run one model, plus what the host needs to talk
    to it.

    ``instructions`` is the program as stored in the program memory, each with the index of
    its ``layer``: per layer either its looped form (SETMM, SETPOST, LOOP) or its
    micro-instructions one by one; then END, a tuple of immutable :class:`Instr`.
    :meth:`expanded` is what the dispatcher issues.
    ``inputs`` and ``outputs`` are the accelerator's ports in graph order, each with its
    placement in ``placements``; the ``input_*`` and ``output_*`` properties are those of a
    program with exactly one of each."""
    config: ArchConfig
    instructions: "tuple[Instr, ...]"
    images: "dict[str, list[int]]"
    layers: "list[LayerPlan]"
    placements: "dict[str, Placement]"
    inputs: "tuple[Port, ...]"
    outputs: "tuple[Port, ...]"
    words: "dict[str, int]" = field(default_factory=dict)
    #: What :meth:`cached` computed. The program is frozen, its instructions a tuple of
    #: immutable :class:`Instr`: what was computed from them cannot go stale (a changed
    #: program is a new one, ``dataclasses.replace``, with an empty cache).
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "instructions", tuple(self.instructions))

    def _only(self, kind: str) -> Port:
        ports = getattr(self, f"{kind}s")
        if len(ports) != 1:     # a caller that handles one port only: a bug
            raise ValueError(f"The program has {len(ports)} {kind}s, not one: use "
                             f"Program.{kind}s")
        return ports[0]

    @property
    def input_value(self) -> str:
        return self._only("input").value

    @property
    def output_value(self) -> str:
        return self._only("output").value

    @property
    def input_placement(self) -> Placement:
        return self.placements[self.input_value]

    @property
    def output_placement(self) -> Placement:
        return self.placements[self.output_value]

    @property
    def macs(self) -> int:
        return sum(layer.macs for layer in self.layers)

    def cached(self, name: str, compute):
        """``compute(self)``, computed once per program (a report reads the expanded program
        and its timing several times)."""
        if name not in self._cache:
            self._cache[name] = compute(self)
        return self._cache[name]

    def expanded(self) -> "list[Instr]":
        """Every instruction the dispatcher issues, in order: the stored ones and, after each
        LOOP, the micro-instructions the walker issues for it (``looped``). A new list each
        call; the expansion is made once (:meth:`cached`)."""
        return list(self.cached("expanded", Program._expand))

    def _expand(self) -> "list[Instr]":
        """The expansion; a nest that repeats in its layer (the bands of a layer in the
        external memory, :mod:`.spill`, alternate between two staging slots) is expanded
        once and issues the same immutable instructions again (ResNet-18 with an external
        memory: 974 nests of 1,413)."""
        out, templates, walks = [], {}, {}
        for instr in self.instructions:
            out.append(instr)
            if instr.op in (Op.SETMM, Op.SETPOST):
                templates[instr.op] = instr.fields
            elif instr.op == Op.LOOP:
                setmm, setpost = templates[Op.SETMM], templates[Op.SETPOST]
                key = (instr.layer, *(tuple(fields.items())
                                      for fields in (setmm, setpost, instr.fields)))
                walk = walks.get(key)
                if walk is None:
                    walk = walks[key] = [Instr.walked(micro, instr.layer) for micro in expand(
                        setmm, setpost, instr.fields, self.config)]
                out.extend(walk)
        return out


def mark_layers(instructions: "list[Instr]", layers: "list[LayerPlan]") -> None:
    """Set each layer's ``first`` and ``last`` to the indices of its first and last stored
    instruction in ``instructions`` (END, the last, belongs to none)."""
    seen = set()
    for index, instr in enumerate(instructions[:-1]):
        if instr.layer not in seen:
            seen.add(instr.layer)
            layers[instr.layer].first = index
        layers[instr.layer].last = index


def encode_program(program: Program) -> "list[int]":
    """Program-memory words of ``program``: one per instruction, or ``fetch_words`` per
    instruction, least significant first, for a narrow program memory; none for a paged
    program (``prog_page``: it is in its ``ext`` image, :mod:`.paging`)."""
    cfg = program.config
    words = encode_instructions(program, [] if cfg.prog_page else program.instructions)
    if not cfg.runtime_program:
        return words
    mask = (1 << cfg.prog_width) - 1
    return [(word >> (cfg.prog_width * k)) & mask for word in words
            for k in range(cfg.fetch_words)]


def encode_instructions(program: Program, instructions: "list[Instr]") -> "list[int]":
    """The instruction words of ``instructions`` (some of ``program``'s, from the first);
    raises :class:`ResourceError` naming the layer of one whose field is out of range."""
    words = []
    for index, instr in enumerate(instructions):
        try:
            words.append(encode(**instr.fields))
        except ValueError as error:
            layer = program.layers[instr.layer].name
            raise ResourceError(f"Layer '{layer}': instruction {index} cannot be encoded: "
                                f"{error}") from error
    return words
