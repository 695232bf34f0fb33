"""The compiler: instruction encoding, activation layout, lowering of small integer graphs,
resource errors, the cycle model and saving a program."""

import dataclasses
import re

import numpy as np
import pytest

from hwonnx.compiler import (FIELDS, LOOP_FIELDS, Op, decode, encode, encode_program,
                             instruction_width, lower, natural_placement, pack_words, predict,
                             unpack_words)
from hwonnx.compiler.alloc import ActAllocator
from hwonnx.compiler.timing import last_write
from hwonnx.compiler.artifact import load_program, save_program
from hwonnx.config import ArchConfig
from hwonnx.errors import ModelError, ResourceError
from hwonnx.golden import evaluate
from hwonnx.ir import Graph, Node, TensorType
from hwonnx.isa import ACTX_FIELDS, ELTW_FIELDS, LOADP_FIELDS, LOADX_FIELDS

from helpers import raises


def ceil_div(a, b):
    return -(-a // b)


# ISA --------------------------------------------------------------------------------------------

def test_fields_tile_the_instruction_word():
    width = instruction_width()
    assert width == sum(f.width for f in FIELDS)
    assert len({f.name for f in FIELDS}) == len(FIELDS)
    seen = 0
    for f in FIELDS:
        bits = encode(**{f.name: -1 if f.signed else (1 << f.width) - 1})
        assert bin(bits).count("1") == f.width
        assert bits & seen == 0                         # no two fields share a bit
        seen |= bits
    assert seen == (1 << width) - 1


@pytest.mark.parametrize("layout", [FIELDS, LOOP_FIELDS, ELTW_FIELDS, LOADX_FIELDS,
                                    LOADP_FIELDS, ACTX_FIELDS],
                         ids=["micro", "loop", "eltw", "loadx", "loadp", "actx"])
def test_encode_decode_round_trip(layout):
    rng = np.random.default_rng(0)
    own = {Op.LOOP: LOOP_FIELDS, Op.ELTW: ELTW_FIELDS, Op.LOADX: LOADX_FIELDS,
           Op.LOADP: LOADP_FIELDS, Op.LOADA: ACTX_FIELDS, Op.STOREA: ACTX_FIELDS}
    ops = [o for o in Op.NAMES if own.get(o, FIELDS) is layout]
    for _ in range(300):
        values = {}
        for f in layout:
            lo, hi = (-(1 << (f.width - 1)), (1 << (f.width - 1)) - 1) if f.signed \
                else (0, (1 << f.width) - 1)
            values[f.name] = int(rng.choice([lo, hi, int(rng.integers(lo, hi, endpoint=True))]))
        values["op"] = int(rng.choice(ops))
        word = encode(**values)
        assert 0 <= word < 1 << instruction_width()
        assert decode(word) == values


def test_missing_fields_encode_as_zero():
    assert decode(encode(op=Op.POST, count=7)) == {f.name: {"op": Op.POST, "count": 7}.get(
        f.name, 0) for f in FIELDS}


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f.name)
def test_encode_range_errors(field):
    lo = -(1 << (field.width - 1)) if field.signed else 0
    hi = (1 << (field.width - 1)) - 1 if field.signed else (1 << field.width) - 1
    kind = "signed " if field.signed else ""
    for value in (lo - 1, hi + 1):
        with raises(ValueError, f"Instruction field {field.name}={value} does not fit "
                                f"{field.width} {kind}bits"):
            encode(**{field.name: value})
    assert decode(encode(**{field.name: lo}))[field.name] == lo
    assert decode(encode(**{field.name: hi}))[field.name] == hi


def test_encode_unknown_field():
    with pytest.raises(KeyError, match=r"^\"Unknown instruction fields \['bogus', 'zz'\]\"$"):
        encode(op=1, zz=1, bogus=2)


# layout -----------------------------------------------------------------------------------------

def lane(words, word, index, rows):
    assert 0 <= words[word] < 1 << (8 * rows)
    return int(np.int8(np.uint8((words[word] >> (8 * index)) & 0xFF)))


@pytest.mark.parametrize("rows", [3, 4, 8])
@pytest.mark.parametrize("shape", [(1, 5, 3, 4), (1, 8, 2, 2), (1, 1, 4, 3), (1, 11, 1, 1)])
def test_pack_unpack_image(rows, shape):
    rng = np.random.default_rng(rows * 100 + shape[1])
    values = rng.integers(-128, 128, shape).astype(np.int8)
    placement = natural_placement(17, shape, rows)
    _, c, h, w = shape
    cb = ceil_div(c, rows)
    assert (placement.base, placement.cb, placement.words) == (17, cb, h * w * cb)
    words = pack_words(values, placement, rows)
    assert len(words) == h * w * cb
    for y in range(h):
        for x in range(w):
            for ch in range(cb * rows):
                got = lane(words, (y * w + x) * cb + ch // rows, ch % rows, rows)
                assert got == (values[0, ch, y, x] if ch < c else 0)
    back = unpack_words(words, placement, rows)
    assert back.dtype == np.int8 and back.shape == shape
    np.testing.assert_array_equal(back, values)


@pytest.mark.parametrize("rows", [3, 8])
@pytest.mark.parametrize("k", [1, 8, 13])
def test_pack_unpack_vector(rows, k):
    values = np.random.default_rng(k).integers(-128, 128, (1, k)).astype(np.int8)
    placement = natural_placement(0, (1, k), rows)
    words = pack_words(values, placement, rows)
    assert len(words) == ceil_div(k, rows) == placement.words
    for i in range(ceil_div(k, rows) * rows):
        assert lane(words, i // rows, i % rows, rows) == (values[0, i] if i < k else 0)
    np.testing.assert_array_equal(unpack_words(words, placement, rows), values)


def test_flattened_placement_keeps_memory():
    rows = 4
    values = np.random.default_rng(9).integers(-128, 128, (1, 6, 3, 2)).astype(np.int8)
    image = natural_placement(0, values.shape, rows)
    flat = image.with_shape((1, 36))
    assert not flat.is_natural_image(rows) and image.is_natural_image(rows)
    words = pack_words(values, image, rows)
    assert pack_words(values.reshape(1, 36), flat, rows) == words
    np.testing.assert_array_equal(unpack_words(words, flat, rows), values.reshape(1, 36))


# lowering ---------------------------------------------------------------------------------------

def conv_out(size, kernel, stride, begin, end, dilation=1):
    return (size + begin + end - dilation * (kernel - 1) - 1) // stride + 1


def chain(c=5, h=6, w=7, m=10, n=9, kernel=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1),
          seed=0):
    """Quantize -> QConv -> Flatten -> QDense -> Dequantize with random int8 constants."""
    rng = np.random.default_rng(seed)
    kh, kw = kernel
    oh = conv_out(h, kh, strides[0], pads[0], pads[2])
    ow = conv_out(w, kw, strides[1], pads[1], pads[3])
    k = m * oh * ow

    def layer(prefix, w_shape, channels, shift):
        return {f"{prefix}.w": rng.integers(-127, 128, w_shape).astype(np.int8),
                f"{prefix}.b": rng.integers(-2000, 2000, channels).astype(np.int32),
                f"{prefix}.m": rng.integers(1 << 30, 1 << 31, channels).astype(np.int32),
                f"{prefix}.s": np.full(channels, shift, np.int32)}

    constants = {**layer("conv", (m, c, kh, kw), m, 39), **layer("fc", (k, n), n, 42)}
    types = {"x": TensorType("float32", (1, c, h, w)), "xq": TensorType("int8", (1, c, h, w)),
             "yq": TensorType("int8", (1, m, oh, ow)), "fq": TensorType("int8", (1, k)),
             "dq": TensorType("int8", (1, n)), "out": TensorType("float32", (1, n))}
    types.update({name: TensorType(str(v.dtype), v.shape) for name, v in constants.items()})
    nodes = [
        Node("quantize", "Quantize", ("x",), ("xq",), {"scale": 0.05, "zero_point": -3}),
        Node("conv", "QConv", ("xq", "conv.w", "conv.b", "conv.m", "conv.s"), ("yq",),
             {"in_zp": -3, "out_zp": -128, "lo": -128, "hi": 127, "strides": strides,
              "pads": pads, "dilations": (1, 1)}),
        Node("flatten", "Flatten", ("yq",), ("fq",), {"axis": 1}),
        Node("fc", "QDense", ("fq", "fc.w", "fc.b", "fc.m", "fc.s"), ("dq",),
             {"in_zp": -128, "out_zp": 4, "lo": -128, "hi": 127}),
        Node("dequantize", "Dequantize", ("dq",), ("out",), {"scale": 0.1, "zero_point": 4}),
    ]
    graph = Graph(nodes, ("x",), ("out",), types, constants)
    graph.verify()
    return graph


def expected_tiles(graph, rows, cols, acc_half):
    """Per layer: (M, K tiles, N tiles, output row width, MACs), from the graph's shapes
    alone (the dense layer's one pixel is the whole input)."""
    _, c, _, _ = graph.types["xq"].shape
    _, m, oh, ow = graph.types["yq"].shape
    kh, kw = graph.constants["conv.w"].shape[2:]
    k, n = graph.constants["fc.w"].shape
    conv_m = oh * ow
    return [
        (conv_m, kh * kw * ceil_div(c, rows), ceil_div(m, cols), ow, oh * ow * m * c * kh * kw),
        (1, oh * ow * ceil_div(m, rows), ceil_div(n, cols), 1, k * n),
    ]


CONFIGS = [ArchConfig(rows=4, cols=4), ArchConfig(), ArchConfig(rows=3, cols=5, acc_depth=16),
           ArchConfig(rows=8, cols=2, acc_depth=12)]
GRAPHS = [dict(), dict(strides=(2, 1), pads=(0, 1, 1, 0), kernel=(3, 2)),
          dict(c=1, m=3, n=10, kernel=(1, 1), pads=(0, 0, 0, 0)), dict(c=16, m=16, h=4, w=4)]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.name}-acc{c.acc_depth}")
@pytest.mark.parametrize("shape", GRAPHS)
def test_lower_chain(config, shape):
    graph = chain(**shape)
    program = lower(graph, config)
    rows, cols = config.rows, config.cols
    instrs = program.expanded()          # what the dispatcher issues
    layers = expected_tiles(graph, rows, cols, config.acc_half)
    assert [layer.name for layer in program.layers] == ["conv", "fc"]
    assert [layer.op for layer in program.layers] == ["QConv", "QDense"]
    assert instrs[-1]["op"] == Op.END and [i["op"] for i in instrs].count(Op.END) == 1
    for index, (m, k_tiles, n_tiles, width, macs) in enumerate(layers):
        mine = [i for i in instrs if i.layer == index]
        matmuls = [i for i in mine if i["op"] == Op.MATMUL]
        posts = [i for i in mine if i["op"] == Op.POST]
        # M tiles (sized by the cycle model's rule of thumb): whole output rows, or pixels
        # where a row does not fit, within half the accumulators, in order
        m_tiles = len(posts) // n_tiles
        sizes = [p["count"] for p in posts[::n_tiles]]
        assert max(sizes) <= config.acc_half and sum(sizes) == m
        assert all(size % width == 0 for size in sizes[:-1]) or width > config.acc_half
        assert sum(i["count"] for i in matmuls) == m * k_tiles * n_tiles
        assert len(matmuls) == m_tiles * k_tiles * n_tiles
        assert len(posts) == m_tiles * n_tiles
        assert sum(p["count"] for p in posts) == m * n_tiles
        assert program.layers[index].macs == macs
        assert program.layers[index].tiles == len(matmuls)
    assert program.macs == sum(layer[-1] for layer in layers)

    # buffers: every address an instruction touches is inside its buffer
    assert program.words["prog"] == len(program.instructions) <= config.prog_depth
    assert program.words["wgt"] == len(program.images["wgt"]) <= config.wgt_depth
    assert program.words["par"] == len(program.images["par"]) <= config.par_depth
    assert program.words["act"] <= config.act_depth
    assert len(program.images["wgt"]) == rows * sum(k * n for _, k, n, _, _ in layers)
    assert len(program.images["par"]) == sum(n for _, _, n, _, _ in layers)
    banks = {}
    for i in instrs:
        if i["op"] == Op.LOADW:
            assert i["wgt_addr"] + rows <= len(program.images["wgt"])
            banks[i["bank"]] = i["wgt_addr"]
        elif i["op"] == Op.MATMUL:
            assert 0 < i["count"] <= config.acc_half
            assert i["acc_addr"] + i["count"] <= config.acc_depth
            assert banks[i["bank"]] == i["wgt_addr"]     # its tile was loaded into its bank
        elif i["op"] == Op.POST:
            assert i["par_addr"] < len(program.images["par"])
            assert i["acc_addr"] + i["count"] <= config.acc_depth

    # activations: a layer's input and output never overlap, and POSTs stay in the output
    node_of = {n.name: n for n in graph.nodes}
    for index, layer in enumerate(program.layers):
        source = program.placements[node_of[layer.name].inputs[0]]
        target = program.placements[layer.output]
        assert (source.base + source.words <= target.base
                or target.base + target.words <= source.base)
        for p in source, target:
            assert 0 <= p.base and p.base + p.words <= program.words["act"]
        for post in (i for i in instrs if i["op"] == Op.POST and i.layer == index):
            last = post["out_addr"] + (post["count"] - 1) * post["out_stride"] + post["nw"]
            assert target.base <= post["out_addr"] and last <= target.base + target.words
    assert program.input_placement.shape == graph.types["xq"].shape
    assert program.output_placement.shape == graph.types["dq"].shape

    # it encodes, one word per instruction, and decodes back to the same fields
    for instr, word in zip(program.instructions, encode_program(program), strict=True):
        fields = instr.fields
        assert {k: v for k, v in decode(word).items() if k in fields} == fields


def test_chain_graph_runs_on_the_golden_model():
    graph = chain()
    x = np.random.default_rng(1).uniform(-5, 5, (3, 5, 6, 7)).astype(np.float32)
    env = evaluate(graph, {"x": x}, keep_all=True)
    assert env["out"].shape == (3, 9) and env["out"].dtype == np.float32
    assert len(np.unique(env["yq"])) > 50                 # the constants are not degenerate


def test_weights_exceed_wgt_depth():
    graph = chain()
    rows, cols = 4, 4
    need = rows * sum(k * n for _, k, n, _, _ in expected_tiles(graph, rows, cols, 512))
    lower(graph, ArchConfig(rows=rows, cols=cols, wgt_depth=need))
    with raises(ResourceError, f"The model needs {need} words of the wgt buffer, but the 4x4 "
                               f"architecture has {need - 1}; raise --wgt-depth or use a "
                               f"larger board"):
        lower(graph, ArchConfig(rows=rows, cols=cols, wgt_depth=need - 1))


def test_activations_exceed_act_depth():
    graph = chain(c=5, h=6, w=7, m=10)
    rows = 4
    in_words = 6 * 7 * ceil_div(5, rows)
    conv_words = 6 * 7 * ceil_div(10, rows)
    depth = in_words + conv_words
    program = lower(graph, ArchConfig(rows=rows, cols=4, act_depth=depth))
    assert program.words["act"] == depth
    with raises(ResourceError, f"Layer 'conv': its output needs {conv_words} activation "
                               f"words, but only {depth - 1 - in_words} of {depth - 1} are "
                               f"free ({in_words} hold live tensors); raise --act-depth or "
                               f"use a larger board"):
        lower(graph, ArchConfig(rows=rows, cols=4, act_depth=depth - 1))


def test_input_larger_than_act_depth_names_the_input():
    """Regression: when the model input alone exceeds act_depth the message blamed a layer
    called 'input' ("Layer 'input': its output needs 84 activation words") instead of naming
    the model input 'x'."""
    with pytest.raises(ResourceError,
                       match=r"^(?!Layer 'input').*'x'.*raise --act-depth or use a larger "
                             r"board$"):
        lower(chain(), ArchConfig(rows=4, cols=4, act_depth=50))


def test_dense_output_reuses_the_freed_input():
    """Once the conv has run, its input is dead: the dense output fits in the space."""
    graph = chain(c=8, h=4, w=4, m=8, n=4)
    program = lower(graph, ArchConfig(rows=8, cols=8))
    assert program.words["act"] == 16 + 16               # input and conv output only
    assert program.placements["dq"].base == program.placements["xq"].base


class CountedReads(dict):
    """A ``last_use`` table that counts the entries read from it."""

    def __init__(self, *args):
        super().__init__(*args)
        self.reads = 0

    def get(self, key, default=None):
        self.reads += 1
        return super().get(key, default)

    def __getitem__(self, key):
        self.reads += 1
        return super().__getitem__(key)

    def items(self):
        for item in super().items():
            self.reads += 1
            yield item

    def __iter__(self):
        for key in super().__iter__():
            self.reads += 1
            yield key


def test_dead_activations_are_freed_in_time_linear_in_the_layers():
    """Regression: after every layer the allocator read the whole model's last-use table, so
    a chain of 4,000 layers took seconds in the allocator alone. A chain of layers, each
    output read by a Reshape (an alias of it) that the next layer reads, as lower() runs
    it."""
    layers = 2000
    last_use = CountedReads({"x": 0})
    for i in range(layers):
        last_use[f"o{i}"], last_use[f"r{i}"] = 2 * i + 1, 2 * i + 2
    alloc = ActAllocator(ArchConfig())
    alloc.allocate("x", 8, 0, "Input 'x'")
    for i in range(layers):
        alloc.allocate(f"o{i}", 8, 2 * i, f"Layer 'l{i}': its output")
        alloc.release_dead(last_use, 2 * i)
        alloc.alias(f"r{i}", f"o{i}")
        alloc.release_dead(last_use, 2 * i + 1)
    assert alloc.high_water == 16                   # two tensors live at a time
    assert list(alloc.regions) == [f"o{layers - 1}"]
    assert last_use.reads <= 10 * layers, last_use.reads


# cycle model --------------------------------------------------------------------------------

END = dict(op=Op.END)


def matmul(bank, count):
    return dict(op=Op.MATMUL, bank=bank, count=count, wait=0)


def loadw(bank):
    return dict(op=Op.LOADW, bank=bank)


def test_end_only_program_takes_three_cycles():
    """The instruction queue fills from a read at ``start`` (cycle 0), on the program memory's
    port from its output register in cycle 2, captured: END leaves in cycle 3 (2 in the
    compact datapath, whose program memory has no output register)."""
    for config in CONFIGS:
        timing = predict([END], config)
        assert timing.total == 3 and timing.dispatch == [3]
    timing = predict([END], dataclasses.replace(CONFIGS[0], mul_stages=1))
    assert timing.total == 2 and timing.dispatch == [2]


def matmul_stream(tiles, count):
    return [matmul(i % 2, count) for i in range(tiles)] + [END]


def lowered_stream(tiles, count):
    """The order ``lower`` emits: two loads ahead, then a load after each MATMUL."""
    program = [loadw(0)] + ([loadw(1)] if tiles > 1 else [])
    for i in range(tiles):
        program.append(matmul(i % 2, count))
        if 1 <= i < tiles - 1:
            program.append(loadw((i + 1) % 2))
    return program + [END]


@pytest.mark.parametrize("config", CONFIGS[:3], ids=lambda c: c.name)
@pytest.mark.parametrize("stream", [matmul_stream, lowered_stream])
def test_back_to_back_tiles_keep_the_array_busy(config, stream):
    # (with loads, a one-tile program skips the second prefetch: count from two tiles)
    first = 1 if stream is matmul_stream else 2
    for count in (config.rows + config.cols + 2, 50, 300):
        totals = [predict(stream(k, count), config).total for k in range(first, 8)]
        assert all(b - a == count for a, b in zip(totals, totals[1:])), (count, totals)
        timing = predict(stream(6, count), config)
        done = [d for d, i in zip(timing.done, stream(6, count)) if i["op"] == Op.MATMUL]
        assert all(b - a == count for a, b in zip(done, done[1:]))
        assert totals[0] > count                 # fill and drain are not free


def test_prediction_is_bounded_by_the_array_throughput():
    config = ArchConfig(rows=4, cols=4)
    program = lower(chain(), config)
    total = predict(program.expanded(), config).total
    fed = sum(i["count"] for i in program.expanded() if i["op"] == Op.MATMUL)
    assert total > fed
    assert program.macs <= total * config.rows * config.cols


def test_eltw_accept_rules():
    """ELTW after a MATMUL waits for the feeder to drain; with ``wait`` it also waits for the
    post-processor; a POST is queued until the MATMULs before it drain, and waits for the
    engine; the next ELTW runs beside that POST; END
    waits for the engine. (Cycle numbers worked out by hand from docs/architecture.md.)"""
    # drain = 3 + array_latency + 1 + 1 = 3 + (4 + 4 + 3) + 1 + 1 (the activation read and its
    # two registers, skew and flow, the multiply's operand, middle and product registers, the
    # accumulator write and the register the sum waits in before the block RAM takes it);
    # post latency 14 (accumulator read, its data registered, bias, the multiply's five
    # stages, the rounding shift's two, zero point, the clamp's flags and choice, activation
    # table, then the write)
    config = ArchConfig(rows=4, cols=4)
    eltw = dict(op=Op.ELTW, count=3)
    post = dict(op=Op.POST, count=3, nw=1)
    program = [matmul(0, 5), post, dict(eltw, wait=1), post, eltw, post, eltw, END]
    timing = predict(program, config)
    # (the first instruction leaves in cycle 3: the instruction queue fills from a read at
    # start through the program memory's output register; every engine takes what is
    # dispatched in t in t + 1, the hand-off)
    # MATMUL dispatched 3, taken 4, starts 5, issues 6..10: drained 10 + 16 = 26
    # POST dispatched 4 into its slot, leaves it at 26, taken 27: idle at 27 + 1 + 14 + 3 = 45
    # ELTW (wait) at 45, taken 46: idle 46 + 1 + 6 + 8 = 61 (from its last B read, the
    # activation buffer's two cycles through the output registers and 6 stages)
    # POST at 61: idle 80; ELTW at 62 (beside the POST): idle 77; POST at 80: idle 99
    # ELTW at 81 (no wait): idle 96; END at 99
    assert timing.dispatch == [3, 4, 45, 61, 62, 80, 81, 99]
    assert timing.done[2] == 60 and timing.total == 99
    assert predict([dict(eltw, count=1), END], config).total == 3 + 1 + 1 + 2 + 8


def test_post_waits_in_its_slot_while_the_next_tile_issues():
    """A POST is accepted at once and starts when the MATMULs before it have drained; the
    next MATMUL issues during that drain; a second POST is accepted only once the first has
    finished. (By hand from docs/architecture.md, Queued POST.)"""
    config = ArchConfig(rows=4, cols=4)      # drain 3 + (4 + 4 + 3) + 1 + 1, post latency 14
    post = dict(op=Op.POST, count=3, nw=1)
    timing = predict([matmul(0, 5), post, matmul(1, 5), post, END], config)
    # MATMUL 1 dispatched 3 (the instruction queue fills from a read at start through the
    # program memory's output register), taken 4 (the hand-off) into the feeder's slot:
    # starts 5, issues 6..10, drained 10 + 16 = 26.
    # POST dispatched 4, leaves its slot at 26, taken 27: idle 27 + 1 + 14 + 3 = 45.
    # MATMUL 3: dispatched 6 (the feeder's slot empties as MATMUL 1 starts, in 5), starts
    # at 10 (the first one's last issue), issues 11..15, drained 31.
    # POST accepted at 45 (the first POST done), starts 45: idle 64. END at 64.
    assert timing.dispatch == [3, 4, 6, 45, 64]
    assert timing.done[1] == 44 and timing.total == 64


def test_unknown_opcode_is_a_bug():
    with pytest.raises(ValueError, match=r"^Unknown opcode 12$"):
        predict([dict(op=12), END], ArchConfig())
    for op in ("LOADX", "LOADP"):
        with pytest.raises(ValueError, match=rf"^{op}, but the 8x8 architecture has no external"):
            predict([dict(op=getattr(Op, op), count=1), END], ArchConfig())
    external = ArchConfig(ext_memory="ulx3s-sdram", ext_depth=1024)
    for op in ("LOADA", "STOREA"):              # an external memory, but no staging buffers
        for config in (ArchConfig(), external):
            with pytest.raises(ValueError, match=rf"^{op}, but the 8x8 architecture has no "
                                                 rf"staging buffers"):
                predict([dict(op=getattr(Op, op), count=1), END], config)


# saving ----------------------------------------------------------------------------------------

def test_save_load_program_round_trip(tmp_path):
    config = ArchConfig(rows=4, cols=4, acc_depth=16)
    program = lower(chain(), config)
    save_program(program, tmp_path)
    loaded = load_program(tmp_path)
    assert loaded.config == config
    assert loaded.instructions == program.instructions
    assert loaded.images == program.images
    assert loaded.layers == program.layers
    assert loaded.words == program.words
    assert (loaded.inputs, loaded.outputs) == (program.inputs, program.outputs)
    assert list(loaded.placements) == list(program.placements)
    for name, p in program.placements.items():
        q = loaded.placements[name]
        assert (q.base, q.height, q.width, q.cb, q.shape) == (p.base, p.height, p.width, p.cb,
                                                              p.shape)
        np.testing.assert_array_equal(q.logical, p.logical)
    hex_lines = (tmp_path / "prog.hex").read_text().splitlines()
    assert [int(line, 16) for line in hex_lines] == encode_program(program)
    assert predict(loaded.expanded(), config) == predict(program.expanded(), config)


def test_load_program_from_an_incomplete_folder(tmp_path):
    save_program(lower(chain(), ArchConfig(rows=4, cols=4)), tmp_path)
    (tmp_path / "placements.npz").unlink()
    with pytest.raises(ModelError,
                       match="^" + re.escape(f"'{tmp_path}' is not a complete hwonnx build "
                                             f"folder (") + r".+"
                       + re.escape("); run 'hwonnx build' first") + "$"):
        load_program(tmp_path)


def test_placement_table_names_streamed_depthwise_layers():
    """A depthwise 3x3 layer streams on the default 8x8 array and the placement table says
    so; a 1x1 depthwise layer with a stride along the rows does not (it would be slower)."""
    from onnx import TensorProto, helper, numpy_helper

    from hwonnx.api import build
    from hwonnx.report import placement_table

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (8, 1, 3, 3)).astype(np.float32), "a"),
             numpy_helper.from_array(rng.normal(0, 0.3, (8, 1, 1, 1)).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "a"], ["h"], name="dw3", group=8, pads=[1] * 4),
             helper.make_node("Conv", ["h", "b"], ["y"], name="dw1", group=8, strides=[1, 2])]
    graph = helper.make_graph(nodes, "dw", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 8, 6, 10])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 8, 6, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    result = build(model, None, calib={"x": rng.normal(0, 1, (4, 1, 8, 6, 10))},
                   verilog=False, log=lambda message: None)
    rows = {line.split(" | ")[0].strip("| "): line
            for line in placement_table(result.graph, result.program).splitlines()}
    assert "depthwise streaming" in rows["dw3"]
    assert "depthwise streaming" not in rows["dw1"]


def test_last_write_follows_the_feeders_walk_of_depthwise_rows():
    """``timing.last_write`` against the feeder's walk stated word by word
    (``hdl/feeder.py``): ``ox`` runs over rows of ``ow`` from 0, ``phase`` counts words mod
    ``vstride`` from each row's start, and a word is kept (writes ``acc_addr``, which then
    advances) when ``phase`` is 0 and ``ox <= vlast``."""
    config = ArchConfig(rows=2, cols=2, acc_depth=64)
    rng = np.random.default_rng(7)
    for _ in range(300):
        ow, vstride = int(rng.integers(1, 9)), int(rng.integers(1, 4))
        vlast, count = int(rng.integers(0, ow)), int(rng.integers(1, 4 * ow))
        acc_addr = int(rng.integers(0, config.acc_depth))
        addr, ox, phase, written = acc_addr, 0, 0, None
        for _word in range(count):
            written = addr % config.acc_depth if phase == 0 and ox <= vlast else None
            addr += written is not None
            ox, phase = (0, 0) if ox == ow - 1 else (ox + 1, (phase + 1) % vstride)
        instr = dict(op=Op.MATMUL, count=count, acc_addr=acc_addr, dw=1, ow=ow,
                     vstride=vstride, vlast=vlast)
        assert last_write(instr, config) == written, (ow, vstride, vlast, count)
    assert last_write(dict(op=Op.MATMUL, count=5, acc_addr=62), config) == 66 % 64


def test_parameter_words_are_kept_per_layout():
    """The emitter's parameter words are packed once per layout and channels' values, for
    every lowering after (param_words._WORDS): the same word as packed anew, and another
    for another array's columns."""
    import importlib
    from dataclasses import replace as changed

    from hwonnx.hdl.layouts import ParamLayout
    words = importlib.import_module("hwonnx.compiler.param_words")

    values = ((5, -7), (1 << 20, 3), (9, 12))
    for cols in (8, 4):
        layout = ParamLayout(changed(ArchConfig(), cols=cols))
        word = words.param_word(*values, layout)
        assert word == words.param_word(*values, layout)
        assert word == words.packed_param_word(*values, layout)
        assert (ParamLayout, cols, *values) in words._WORDS   # (a layout is its columns)
    assert len({k[1] for k in words._WORDS if k[2:] == values}) == 2
