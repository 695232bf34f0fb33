"""A compiled model for an architecture and a board: the integer graph as the architecture
computes it, the program with its buffers sized to the model, and the fallbacks a board build
takes when the model and the array do not fit the device together (``docs/architecture.md``,
"Architecture configuration"; ``boards/fit.py`` counts the resources)."""

from dataclasses import replace

from .boards import check_board_fit, check_fits, get_board
from .compiler.alloc import ActivationBufferFull
from .compiler.artifact import is_int
from .compiler.layout import natural_placement
from .compiler.lower import lower
from .compiler.program import Program
from .compiler.replay import Lowerings
from .compiler.segments import is_segmented, lower_segments
from .compiler.sizing import needs, probe, sized
from .compiler.spill import StageTooSmall
from .compiler.stream import SlotTooSmall
from .config import ArchConfig
from .errors import ResourceError
from .ir import Graph
from .isa import Op, addressable
from .memories import MEMORIES
from .quant import adds_on_array

__all__ = ["FALLBACK_ARRAYS", "configure_arch", "fit_board", "for_architecture", "lower_sized"]


def lower_sized(int_graph: Graph, config: ArchConfig, size=None, fixed=(),
                loops: bool = True) -> "tuple[Program, ...]":
    """Lower ``int_graph`` for ``config``, its buffers (but ``fixed``) sized to the model
    (:func:`~hwonnx.compiler.sizing.sized`) when ``size`` is ``"sim"`` or a board: the
    program, or of a segmented graph its segments' programs in order
    (:func:`~hwonnx.compiler.segments.lower_segments`)."""
    if is_segmented(int_graph):
        return tuple(lower_segments(int_graph, config, size is not None, fixed, None if size in (
            None, "sim") else _block_depth(size), loops))
    if size is None:
        return (lower(int_graph, config, loops),)
    return (_lower_sized(int_graph, config, size, fixed, loops),)


def _lower_sized(int_graph: Graph, config: ArchConfig, size: str, fixed=(),
                 loops: bool = True, target=None) -> Program:
    """The program of ``config`` sized (:func:`_sized_config`), checked against board
    ``target`` when given (:func:`_lower_checked`). Where that fails with the staging buffers
    grown (the other bands of the grown buffers can need more of a buffer sized before they
    grew), the program with the staging buffers it was sized with. The lowerings share
    how they ended (:class:`~.compiler.replay.Lowerings`)."""
    lowerings = Lowerings()

    def checked(sized_config):
        if target is None:
            return lower(int_graph, sized_config, loops, lowerings)
        return _lower_checked(int_graph, sized_config, target, loops, lowerings)

    grown = _sized_config(int_graph, config, size, fixed, loops, lowerings=lowerings)
    try:
        return checked(grown)
    except ResourceError:
        ungrown = _sized_config(int_graph, config, size, fixed, loops, grow=False,
                                lowerings=lowerings)
        if ungrown == grown:
            raise
        return checked(ungrown)


def _sized_config(int_graph: Graph, config: ArchConfig, size: str, fixed=(),
                  loops: bool = True, grow: bool = True,
                  lowerings: "Lowerings | None" = None) -> ArchConfig:
    """``config`` with the buffers but ``fixed`` sized to what ``int_graph`` needs on it (one
    lowering with every buffer as deep as the instructions address). With an external
    memory, a weight buffer (not ``fixed``) too small for two slots of a streamed layer's
    or part's weights grows to what they need (for a simulation: doubles), and an activation
    buffer too small for the tensors left on chip doubles, until they fit; a staging buffer
    (``stage_in_depth``, ``stage_out_depth``) too small for a band of one row grows to what
    it needs or a quarter of the activation buffer, the larger (a power of two for a
    simulation, whole block RAMs for a board); a program that streams weights keeps its
    weight buffer's depth (the parts and slots are cut to it). For a board, a program that
    moves activations then has staging buffers grown by :func:`_grown_stage` (the activation
    buffer holds only the tensors left on chip: the windows are in the staging buffers;
    ``grow`` False: not grown; ``lowerings``: how those of ``int_graph`` before ended)."""
    while True:
        try:
            first = lower(int_graph, probe(config, fixed), loops, lowerings)
            break
        except StageTooSmall as error:
            config = _staged(config, error, size, fixed)
        except (SlotTooSmall, ActivationBufferFull) as error:
            name = "wgt" if isinstance(error, SlotTooSmall) else "act"
            depth = getattr(config, f"{name}_depth")
            grown = 2 * depth
            if name == "wgt" and size != "sim":     # whole blocks, as many as two slots need
                block = _block_depth(size)
                grown = max(-(-error.words // block), depth // block + 1) * block
            elif name == "wgt":     # every depth short of two slots of the part fails too
                while grown < error.words and 2 * grown <= addressable(name):   # (its parts
                    grown *= 2      # are one group of channels, whatever the depth)
            if not config.ext_memory or name in fixed or grown > addressable(name):
                raise
            config = replace(config, **{f"{name}_depth": grown})
    if any(layer.ext_words for layer in first.layers):
        fixed = set(fixed) | {"wgt"}
    config = sized(config, needs(first), fixed, None if size == "sim" else _block_depth(size))
    if grow and size != "sim" and any(instr.op in Op.ACTX for instr in first.instructions):
        config = _grown_stage(config, get_board(size), _whole_windows(int_graph, config.rows),
                              fixed)
    return config


def _staged(config: ArchConfig, error: StageTooSmall, size: str, fixed) -> ArchConfig:
    """``config`` with each staging buffer too small for the band of ``error`` grown (see
    :func:`_sized_config`); raises ``error`` when one is ``fixed`` or there is no external
    memory."""
    changes = {}
    block = 1 if size == "sim" else _block_depth(size)
    for name, need in zip(("stage_in", "stage_out"), error.words):
        depth = getattr(config, f"{name}_depth")
        words = max(need, config.act_depth // 4)
        words = _pow2(words) if size == "sim" else -(-words // block) * block
        if depth < need and (name in fixed or not config.ext_memory):
            raise error
        if depth < words and name not in fixed:
            changes[f"{name}_depth"] = words
    return replace(config, **changes)


#: The deepest staging buffers a board build grows, and the share of the device's block RAM
#: it may fill doing so. The rest is left to the place and route: on the ULX3S-85F a design of
#: 156 of 208 block RAMs routed in 14 minutes, while ones of 180 and 196 still had thousands
#: of overused wires after 25 and 35 minutes (nextpnr's router2 was no faster at 180).
STAGE_LIMIT, STAGE_SHARE = 16384, 0.75


def _whole_windows(graph: Graph, rows: int) -> "tuple[int, int]":
    """Staging words beyond which no band grows (in, out): twice the largest sum of a layer's
    image inputs, and of its image output (every layer in one band, double-buffered)."""
    def words(value: str) -> int:
        shape = graph.types[value].shape
        return natural_placement(0, shape, rows).words if len(shape) == 4 else 0
    layers = [node for node in graph.nodes if node.outputs]
    return (2 * max((sum(words(v) for v in node.inputs if v and v not in graph.constants)
                     for node in layers), default=0),
            2 * max((words(node.outputs[0]) for node in layers), default=0))


def _grown_stage(config: ArchConfig, board, limits: "tuple[int, int]", fixed) -> ArchConfig:
    """``config`` with its staging buffers (but ``fixed``) as deep as ``board``'s block RAM
    allows, a whole block at a time to the shallower, up to ``limits``
    (:func:`_whole_windows`) or :data:`STAGE_LIMIT` words, the design within
    :data:`STAGE_SHARE` of the device: taller bands, so fewer passes over a streamed layer's
    weights and over the rows that neighbouring bands share, and more layers
    double-buffered."""
    block = _block_depth(board.name)
    grown = config
    while True:
        depths = {f"{name}_depth": getattr(grown, f"{name}_depth")
                  for name, limit in zip(("stage_in", "stage_out"), limits)
                  if name not in fixed
                  and getattr(grown, f"{name}_depth") < min(limit, STAGE_LIMIT)}
        if not depths:
            return grown
        field = min(depths, key=depths.get)
        trial = replace(grown, **{field: depths[field] + block})
        try:
            check_fits(trial, board, margin=STAGE_SHARE)
        except ResourceError:
            return grown
        grown = trial


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _block_depth(board: str) -> int:
    family = get_board(board).family_info
    return family.block_bits // max(family.block_widths)


def _lower_checked(graph: Graph, sized_config: ArchConfig, target, loops: bool = True,
                   lowerings: "Lowerings | None" = None) -> Program:
    """The program of ``sized_config`` (:func:`_sized_config`) if it fits ``target``;
    otherwise raises :class:`ResourceError`, before lowering when the buffers do not fit (a
    board build may try a dozen configurations before one fits)."""
    check_fits(sized_config, target)
    program = lower(graph, sized_config, loops, lowerings)
    check_board_fit(program, target)
    return program


#: Arrays a board build may fall back to, largest first, when the board's default array and
#: the model's buffers do not fit the device together and no array was given.
FALLBACK_ARRAYS = ((16, 16), (12, 12), (8, 8), (8, 4), (4, 4), (4, 2), (4, 1), (2, 2), (1, 1))


def fit_board(graph: Graph, program: Program, target, fixed, choose_array: bool = False,
               log=print) -> Program:
    """``program`` if it fits ``target``; otherwise, the accumulators not being ``fixed``,
    the same model with half the accumulators (smaller output tiles) until it fits, down to
    64 words; otherwise, with ``choose_array`` (no array given), the largest smaller array of
    :data:`FALLBACK_ARRAYS` with which it fits (fewer rows pad fewer lanes: a 1-channel image
    takes half the activation words on 4 rows as on 8). Raises the first program's
    :class:`ResourceError` when none fits."""
    try:
        check_board_fit(program, target)
        return program
    except ResourceError as error:
        first = error
    try:
        return _smaller_tiles(graph, program.config, target, fixed)
    except ResourceError:
        pass
    if choose_array:
        start = program.config
        for rows, cols in FALLBACK_ARRAYS:
            if rows * cols >= start.rows * start.cols:
                continue
            config = replace(start, rows=rows, cols=cols, post_lanes=0)
            try:
                try:
                    other = _lower_sized(graph, config, target.name, fixed, target=target)
                except ResourceError:
                    other = _smaller_tiles(graph, _sized_config(graph, config, target.name,
                                                                fixed), target, fixed)
            except ResourceError:
                continue
            log(f"The {start.name} array and this model's buffers do not fit board "
                f"'{target.name}'; using a {other.config.name} array")
            return other
    default = target.default_config
    if target.ext_memory and not program.config.ext_memory:
        if program.words["wgt"] > default.wgt_depth:
            raise ResourceError(f"{first}; --ext-memory {target.ext_memory} streams the "
                                f"weights beyond {default.wgt_depth} words from the board's "
                                f"external memory") from first
        if program.words["act"] > default.act_depth:
            raise ResourceError(f"{first}; with --ext-memory {target.ext_memory} the largest "
                                f"tensors live in the board's external memory") from first
    raise first


def _smaller_tiles(graph: Graph, config: ArchConfig, target, fixed) -> Program:
    """The program with half, a quarter, ... of ``config``'s accumulators (more, smaller
    output tiles; the other buffers sized again) that first fits ``target``, down to 64 words
    and unless the accumulators are ``fixed``; raises :class:`ResourceError` when none does."""
    while "acc" not in fixed and config.acc_depth > 64:
        config = replace(config, acc_depth=config.acc_depth // 2)
        try:
            return _lower_sized(graph, config, target.name, set(fixed) | {"acc"},
                                target=target)
        except ResourceError:
            continue
    raise ResourceError(f"No smaller output tiles of the {config.name} array fit board "
                        f"'{target.name}'")


def for_architecture(graph: Graph, config: ArchConfig, log=print) -> Graph:
    """The integer ``graph`` as ``config`` computes it: residual sums on the array where the
    element-wise engine cannot take them (:func:`~hwonnx.quant.adds_on_array`), and layers
    that keep a pre-quantized model's own parameters rounding as onnxruntime does where the
    architecture can (``ArchConfig.ort_rounding``), otherwise half up, which differs from
    onnxruntime by 1 LSB on exact ties."""
    graph = adds_on_array(graph, config.eltwise_engine)
    layers = [n for n in graph.nodes if n.attrs.get("rounding") == "ort"]
    if not layers or config.ort_rounding:
        return graph
    log(f"{len(layers)} layer(s) of this pre-quantized model round half up: the {config.name} "
        f"architecture has no onnxruntime rounding unit (ort_rounding), so results may differ "
        f"from onnxruntime by 1 LSB on exact ties")
    return replace(graph, nodes=tuple(n.with_attrs(rounding="half_up") if n in layers else n
                                      for n in graph.nodes))


def configure_arch(config: ArchConfig, ext_memory: "str | None" = None,
                   **changes: "int | None") -> ArchConfig:
    """``config`` with the ``changes`` that are not None (``rows=16``, ``wgt_depth=4096``, as
    ``hwonnx build`` and ``hwonnx inspect`` take them from their options); with
    ``ext_memory``, the external memory of that name (:data:`hwonnx.memories.MEMORIES`),
    all of it (``ext_depth``: its size in weight words of the resulting array).

    Raises
    ------
    ResourceError
        If the result is not a valid architecture: ``Invalid architecture: <why>``, or the
        external memory is unknown.
    """
    changes = {k: v for k, v in changes.items() if v is not None}
    if not changes and ext_memory is None:
        return config
    if ext_memory is not None and ext_memory not in MEMORIES:
        raise ResourceError(f"Unknown external memory '{ext_memory}'; known memories are "
                            f"{', '.join(sorted(MEMORIES))}")
    try:
        if ext_memory is not None:      # with the other changes: the staging buffers need it
            cols = changes.get("cols", config.cols)     # (one that is not is refused first)
            words = MEMORIES[ext_memory].words(cols) if is_int(cols) and cols > 0 else 0
            changes.update(ext_memory=ext_memory, ext_depth=words)
        return replace(config, **changes)
    except (TypeError, ValueError) as error:
        raise ResourceError(f"Invalid architecture: {error}") from error
