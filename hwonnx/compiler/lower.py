"""Lower an integer graph onto the systolic array: tiling, buffer allocation, instructions and
memory images."""

from dataclasses import dataclass, field, replace

import numpy as np

from ..config import ArchConfig
from ..errors import ResourceError, UnsupportedOperatorError
from ..golden.im2col import conv_output_size
from ..golden.ops import INT32_MAX, INT32_MIN, accumulate_bound
from ..ir import Graph, Node
from .alloc import ActAllocator
from .isa import Op, encode
from .layout import Placement, natural_placement

__all__ = ["Program", "LayerPlan", "lower", "encode_program"]


@dataclass
class LayerPlan:
    """One array layer (QConv or QDense) and the instructions that compute it."""
    name: str
    op: str
    output: str
    macs: int
    first: int = 0          # index of its first instruction
    last: int = 0           # index of its last instruction (inclusive)
    tiles: int = 0


@dataclass
class Program:
    """Everything the accelerator needs to run one model, plus what the host needs to talk
    to it."""
    config: ArchConfig
    instructions: "list[dict]"
    images: "dict[str, list[int]]"
    layers: "list[LayerPlan]"
    placements: "dict[str, Placement]"
    input_name: str
    output_name: str
    input_value: str        # integer value the host writes
    output_value: str       # integer value the host reads
    words: "dict[str, int]" = field(default_factory=dict)

    @property
    def input_placement(self) -> Placement:
        return self.placements[self.input_value]

    @property
    def output_placement(self) -> Placement:
        return self.placements[self.output_value]

    @property
    def macs(self) -> int:
        return sum(layer.macs for layer in self.layers)

    def truncated(self, layer: int) -> "Program":
        """The program that stops after layer ``layer``, whose output it then reads: used to
        measure per-layer cycles and to find the first layer whose output differs. Weight
        loads that prefetch later layers are dropped with them."""
        instructions = [i for i in self.instructions
                        if i["op"] != Op.END and i["layer"] <= layer]
        instructions.append(dict(op=Op.END, layer=layer))
        return replace(self, instructions=instructions,
                       output_value=self.layers[layer].output)


def lower(graph: Graph, config: ArchConfig) -> Program:
    """Compile the integer ``graph`` for ``config``."""
    quantizers = [n for n in graph.nodes if n.op == "Quantize"]
    dequantizers = [n for n in graph.nodes if n.op == "Dequantize"]
    if len(quantizers) != 1 or len(dequantizers) != 1:
        raise ResourceError(f"The model has {len(quantizers)} input(s) and "
                            f"{len(dequantizers)} output(s); this version of hwonnx maps "
                            f"models with exactly one input and one output")
    body = [n for n in graph.nodes if n.op not in ("Quantize", "Dequantize")]
    unknown = [n for n in body if n.op not in ("QConv", "QDense", "Flatten", "Reshape")]
    if unknown:
        raise UnsupportedOperatorError([(n.name, n.op, "", 0) for n in unknown])

    rows = config.rows
    alloc = ActAllocator(config)
    last_use = {}
    for index, node in enumerate(body):
        for value in node.inputs[:1]:
            last_use[value] = index
    last_use[dequantizers[0].inputs[0]] = len(body)

    input_value = quantizers[0].outputs[0]
    shape = graph.types[input_value].shape
    if len(shape) not in (2, 4) or shape[0] != 1:
        raise ResourceError(f"Input '{quantizers[0].inputs[0]}' has shape {shape}; the array "
                            f"takes [1, C, H, W] images or [1, K] vectors")
    placements = {input_value: natural_placement(0, shape, rows)}
    placements[input_value] = natural_placement(
        alloc.allocate(input_value, placements[input_value].words, 0,
                       f"Input '{quantizers[0].inputs[0]}'"), shape, rows)

    builder = _Builder(graph, config)
    layers = []
    for index, node in enumerate(body):
        source = placements[node.inputs[0]]
        out = node.outputs[0]
        if node.op in ("Flatten", "Reshape"):
            placements[out] = source.with_shape(graph.types[out].shape)
            alloc.alias(out, node.inputs[0])
        else:
            out_shape = graph.types[out].shape
            words = natural_placement(0, out_shape, rows).words
            base = alloc.allocate(out, words, index, f"Layer '{node.name}': its output")
            placements[out] = natural_placement(base, out_shape, rows)
            layers.append(builder.layer(node, source, placements[out]))
        alloc.release_dead(last_use, index)
    if not layers:
        raise ResourceError("The model has no Conv, Gemm or MatMul layer to put on the array")
    instructions = builder.finish()
    program = Program(config, instructions, builder.images(), layers, placements,
                      quantizers[0].inputs[0], dequantizers[0].outputs[0], input_value,
                      dequantizers[0].inputs[0])
    program.words = {"prog": len(instructions), "wgt": len(builder.wgt),
                     "par": len(builder.par), "act": alloc.high_water}
    for name, used in program.words.items():
        depth = getattr(config, f"{name}_depth")
        if used > depth:
            raise ResourceError(f"The model needs {used} words of the {name} buffer, but the "
                                f"{config.name} architecture has {depth}; raise "
                                f"--{name}-depth or use a larger board")
    return program


class _Builder:
    """Accumulates tiles, instructions and memory images layer by layer."""

    def __init__(self, graph: Graph, config: ArchConfig):
        self.graph, self.config = graph, config
        self.tiles: "list[tuple[dict, dict | None, int]]" = []   # (matmul, post, layer)
        self.wgt: "list[int]" = []
        self.par: "list[int]" = []
        self.output_tiles = 0
        self.layer_count = 0

    def layer(self, node: Node, source: Placement, target: Placement) -> LayerPlan:
        cfg, rows, cols = self.config, self.config.rows, self.config.cols
        consts = self.graph.constants
        w, bias, mult, shift = (consts[v] for v in node.inputs[1:5])
        attrs = node.attrs
        if node.op == "QConv":
            if not source.is_natural_image(rows):
                raise ResourceError(f"Layer '{node.name}': its input is a reshaped tensor "
                                    f"that is not an image in [1, C, H, W] order")
            n_out, c_in, kh, kw = w.shape
            ih, iw = source.height, source.width
            sy, sx = attrs["strides"]
            pt, pl, pb, pr = attrs["pads"]
            dy, dx = attrs["dilations"]
            oh = conv_output_size(ih, kh, sy, pt, pb, dy)
            ow = conv_output_size(iw, kw, sx, pl, pr, dx)
            phys = np.zeros((n_out, kh, kw, source.cb * rows), dtype=np.int64)
            phys[..., :c_in] = w.transpose(0, 2, 3, 1)
            macs = oh * ow * n_out * c_in * kh * kw
        else:   # QDense: the whole input tensor is one pixel of source.words words
            k_in, n_out = w.shape
            ih = iw = oh = ow = kh = kw = sy = sx = dy = dx = 1
            pt = pl = 0
            phys = np.zeros((n_out, 1, 1, source.words * rows), dtype=np.int64)
            valid = source.logical >= 0
            phys[:, 0, 0, valid] = w[source.logical[valid]].T
            macs = n_out * k_in
        cb_in = source.cb if node.op == "QConv" else source.words
        in_zp, out_zp = int(attrs["in_zp"]), int(attrs["out_zp"])
        bound = accumulate_bound(phys.reshape(n_out, -1)) + np.abs(bias.astype(np.int64))
        if bound.max(initial=0) > INT32_MAX:
            raise ResourceError(f"Layer '{node.name}': its int32 accumulator could overflow "
                                f"(bound {int(bound.max())} for channel "
                                f"{int(bound.argmax())}); splitting the reduction is not "
                                f"supported yet")
        folded = bias.astype(np.int64) - in_zp * phys.reshape(n_out, -1).sum(axis=1)
        if folded.min(initial=0) < INT32_MIN or folded.max(initial=0) > INT32_MAX:
            raise ResourceError(f"Layer '{node.name}': the bias with the input zero point "
                                f"folded in does not fit int32")

        plan = LayerPlan(node.name, node.op, node.outputs[0], int(macs))
        plan.first = len(self.tiles)
        m_total, m_tile = oh * ow, min(oh * ow, cfg.acc_half)
        k_tiles = [(ky, kx, cb) for ky in range(kh) for kx in range(kw) for cb in range(cb_in)]
        tile_addr = {}
        par_base = len(self.par)
        for n0 in range(0, n_out, cols):
            nt = min(cols, n_out - n0)
            self.par.append(_param_word(folded[n0:n0 + nt], mult[n0:n0 + nt],
                                        shift[n0:n0 + nt], cols))
            for ky, kx, cb in k_tiles:
                tile_addr[n0, ky, kx, cb] = len(self.wgt)
                block = np.zeros((rows, cols), dtype=np.int64)
                block[:, :nt] = phys[n0:n0 + nt, ky, kx, cb * rows:(cb + 1) * rows].T
                self.wgt.extend(_int8_word(row) for row in block)
        first_of_layer = True
        for m0 in range(0, m_total, m_tile):
            mt = min(m_tile, m_total - m0)
            oy0, ox0 = divmod(m0, ow)
            for n_index, n0 in enumerate(range(0, n_out, cols)):
                nt = min(cols, n_out - n0)
                acc_base = (self.output_tiles % 2) * cfg.acc_half
                self.output_tiles += 1
                for k_index, (ky, kx, cb) in enumerate(k_tiles):
                    iy0 = oy0 * sy + ky * dy - pt
                    ix0 = ox0 * sx + kx * dx - pl
                    ixr = kx * dx - pl
                    matmul = dict(
                        op=Op.MATMUL, wait=int(first_of_layer), first=int(k_index == 0),
                        count=mt, wgt_addr=tile_addr[n0, ky, kx, cb], acc_addr=acc_base,
                        act_addr=source.base + (iy0 * iw + ix0) * cb_in + cb,
                        act_row=source.base + (iy0 * iw + ixr) * cb_in + cb,
                        ow=ow, ox0=ox0, ih=ih, iw=iw, iy0=iy0, ix0=ix0, ixr=ixr, sy=sy, sx=sx,
                        step_x=sx * cb_in, step_y=sy * iw * cb_in, zp=in_zp)
                    first_of_layer = False
                    post = None
                    if k_index == len(k_tiles) - 1:
                        post = dict(
                            op=Op.POST, acc_addr=acc_base, count=mt, par_addr=par_base + n_index,
                            out_addr=target.base + m0 * target.cb + n0 // rows,
                            out_stride=target.cb, nw=(n0 + nt - 1) // rows - n0 // rows + 1,
                            lane_off=n0 % rows, nt=nt, zp=out_zp, lo=int(attrs["lo"]),
                            hi=int(attrs["hi"]))
                    self.tiles.append((matmul, post, self.layer_count))
        plan.tiles = len(self.tiles) - plan.first
        self.layer_count += 1
        return plan

    def finish(self) -> "list[dict]":
        """Order the instructions so that weight loads run ahead of the array: LOADW for tile
        i+1 is issued right after MATMUL i (it waits for tile i-1 to leave the bank it
        reuses), and a POST comes after the LOADW that follows its last MATMUL."""
        program = []

        def loadw(i):
            matmul, _, layer = self.tiles[i]
            matmul["bank"] = i % 2
            program.append(dict(op=Op.LOADW, bank=i % 2, wgt_addr=matmul["wgt_addr"],
                                layer=layer))

        count = len(self.tiles)
        loadw(0)
        if count > 1:
            loadw(1)
        for i, (matmul, post, layer) in enumerate(self.tiles):
            program.append({**matmul, "bank": i % 2, "layer": layer})
            if 1 <= i < count - 1:
                loadw(i + 1)
            if post is not None:
                program.append({**post, "layer": layer})
        program.append(dict(op=Op.END, layer=self.layer_count - 1))
        return program

    def images(self) -> "dict[str, list[int]]":
        return {"wgt": list(self.wgt), "par": list(self.par)}


def _int8_word(values) -> int:
    return int.from_bytes(np.asarray(values, dtype=np.int8).tobytes(), "little")


def _param_word(bias, mult, shift, cols: int) -> int:
    word = 0
    for c in range(cols):
        b, m, s = (int(bias[c]), int(mult[c]), int(shift[c])) if c < len(bias) else (0, 0, 1)
        channel = (b & 0xFFFFFFFF) | ((m & 0xFFFFFFFF) << 32) | ((s & 0xFF) << 64)
        word |= channel << (72 * c)
    return word


def encode_program(program: Program) -> "list[int]":
    """Instruction words of ``program`` (the ``layer`` key is metadata, not encoded)."""
    words = []
    for index, instr in enumerate(program.instructions):
        fields = {k: v for k, v in instr.items() if k != "layer"}
        try:
            words.append(encode(**fields))
        except ValueError as error:
            layer = program.layers[instr["layer"]].name
            raise ResourceError(f"Layer '{layer}': instruction {index} cannot be encoded: "
                                f"{error}") from error
    return words
