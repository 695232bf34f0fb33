"""Lowering small integer graphs onto the array: tiles, programs that run on the golden
model, resource errors, and the activation allocator."""


import numpy as np
import pytest

from hwonnx.compiler import Op, decode, encode_program, lower
from hwonnx.compiler.alloc import ActAllocator
from hwonnx.config import ArchConfig
from hwonnx.errors import ResourceError
from hwonnx.golden import evaluate

from helpers import raises
from compiler_helpers import CONFIGS, ceil_div, chain


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


@pytest.mark.parametrize("rows", [4, 8])
def test_a_reshape_that_keeps_the_channels_is_a_free_view_of_the_image(rows):
    """A Reshape of a [1, C, h, w] image to [1, C, h', w'] with h' w' = h w (a ViT's patch
    tokens: [1, C, h w, 1]) keeps every element in its lane and word: its placement is that
    image's natural one, at the same words, so a convolution reads it (issue 38); a Reshape
    that splits the channels keeps the words under a logical shape the layers do not read as
    an image, a packed input is never relabelled."""
    from dataclasses import replace

    from hwonnx.compiler.layout import layout_view, natural_placement

    image = natural_placement(40, (1, 12, 4, 4), rows)
    for shape in [(1, 12, 16, 1), (1, 12, 2, 8), (1, 12, 1, 16)]:
        view = layout_view(image, shape, rows)
        assert view.is_natural_image(rows)
        assert (view.base, view.words, view.height * view.width) == (40, image.words, 16)
        assert view == natural_placement(40, shape, rows)
    for shape in [(1, 24, 2, 4), (1, 192), (1, 12, 16)]:
        view = layout_view(image, shape, rows)
        assert (view.height, view.width, view.shape) == (4, 4, shape)
        assert not view.is_natural_image(rows)
    packed = replace(image, packed=True)
    assert not layout_view(packed, (1, 12, 16, 1), rows).is_natural_image(rows)
