"""Seeded random integer graphs (Quantize -> layers -> Dequantize) for RTL tests, and
Hypothesis strategies of random layer and graph descriptions (:func:`layer_cases`,
:func:`graph_cases`) for the randomized RTL tier (``tests/end_to_end/test_random_rtl.py``)."""

import numpy as np

from hwonnx.golden.im2col import conv_output_size
from hwonnx.ir import Graph, Node, TensorType
from hwonnx.quant import requant_params

__all__ = ["random_conv_spec", "random_dense_spec", "chain_graph", "layer_cases",
           "graph_cases", "KINDS"]


def random_conv_spec(rng) -> dict:
    while True:
        spec = dict(op="conv", cin=int(rng.integers(1, 13)), cout=int(rng.integers(1, 14)),
                    h=int(rng.integers(1, 10)), w=int(rng.integers(1, 10)),
                    k=(int(rng.integers(1, 4)), int(rng.integers(1, 4))),
                    strides=(int(rng.integers(1, 3)), int(rng.integers(1, 3))),
                    pads=tuple(int(p) for p in rng.integers(0, 3, 4)),
                    dilations=(int(rng.integers(1, 3)), int(rng.integers(1, 3))),
                    relu=bool(rng.integers(0, 2)))
        oh = conv_output_size(spec["h"], spec["k"][0], spec["strides"][0], spec["pads"][0],
                              spec["pads"][2], spec["dilations"][0])
        ow = conv_output_size(spec["w"], spec["k"][1], spec["strides"][1], spec["pads"][1],
                              spec["pads"][3], spec["dilations"][1])
        if oh >= 1 and ow >= 1:
            return spec


def random_dense_spec(rng) -> dict:
    return dict(op="dense", cin=int(rng.integers(1, 41)), cout=int(rng.integers(1, 26)),
                relu=bool(rng.integers(0, 2)))


def chain_graph(rng, specs: "list[dict]", input_shape: "tuple[int, ...]") -> Graph:
    """A graph applying ``specs`` in order; a ``{"op": "flatten"}`` spec flattens,
    ``{"op": "avgpool" | "maxpool", "k": ..., "strides": ..., "pads": ...}`` pools (max pooling
    also with ``dilations``, and ``identity`` for the quantizer's exact copy; average pooling
    with ``exclude_pad``: ``count_include_pad=0``), and
    ``{"op": "add", "with": i}`` adds the output of spec ``i`` (-1: the graph input) to the
    current value, ``{"op": "concat", "with": [i, ...]}`` concatenates the current value and
    the outputs of specs ``i`` along the channels (each source requantized with its own
    multiplier). Conv specs may have a ``group``; any layer spec with ``table`` gets a
    random activation table; conv and dense specs may set ``rounding="ort"`` (onnxruntime's
    rounding, for an architecture with ``ort_rounding``) and ``hi`` (the upper clamp); conv and
    pooling specs ``pad_q`` (the int8 padding value of a folded constant Pad; not with
    ``exclude_pad``); conv and dense specs ``wbits`` (weights of that many bits, default 8);
    any spec ``gain``, a factor on its requantization scales (default 1).
    Layer shapes follow from
    ``input_shape``; weights, biases, scales and zero points are random."""
    types = {"x": TensorType("float32", input_shape), "x:q": TensorType("int8", input_shape)}
    zp = int(rng.integers(-128, 20))
    nodes = [Node("quantize", "Quantize", ("x",), ("x:q",), {"scale": 0.05, "zero_point": zp})]
    constants, value, shape = {}, "x:q", input_shape
    history = {-1: ("x:q", input_shape, zp)}
    for index, spec in enumerate(specs):
        name, out = f"layer{index}", f"v{index}:q"
        if spec["op"] == "flatten":
            shape = (1, int(np.prod(shape[1:])))
            nodes.append(Node(name, "Flatten", (value,), (out,), {"axis": 1}))
        elif spec["op"] == "concat":
            sources = [(value, shape, zp)] + [history[i] for i in spec["with"]]
            assert all(len(s) == len(shape) and s[2:] == shape[2:] for _, s, _ in sources)
            c = sum(s[1] for _, s, _ in sources)
            zp_out = int(rng.integers(-30, 30))
            mult, shift = requant_params(rng.uniform(0.25, 2.0, c) * spec.get("gain", 1), name)
            consts = {f"{name}:m": mult, f"{name}:s": shift}
            constants.update(consts)
            for key, array in consts.items():
                types[key] = TensorType(str(array.dtype), array.shape)
            attrs = {"zps": tuple(z for _, _, z in sources), "out_zp": zp_out, "lo": -128,
                     "hi": 127}
            if spec.get("table"):
                attrs["table"] = tuple(int(v) for v in rng.integers(-128, 128, 256))
            nodes.append(Node(name, "QConcat", tuple(v for v, _, _ in sources) + tuple(consts),
                              (out,), attrs))
            zp, shape = zp_out, (1, c) + shape[2:]
        elif spec["op"] in ("avgpool", "maxpool", "add"):
            zp_out = int(rng.integers(-30, 30))
            c = shape[1]
            mult, shift = requant_params(rng.uniform(0.3, 1.0, c) / 4 * spec.get("gain", 1),
                                         name)
            consts = {f"{name}:m": mult, f"{name}:s": shift}
            if spec["op"] in ("avgpool", "maxpool"):
                kh, kw = spec["k"]
                dy, dx = spec.get("dilations", (1, 1))
                oh = conv_output_size(shape[2], kh, spec["strides"][0], spec["pads"][0],
                                      spec["pads"][2], dy)
                ow = conv_output_size(shape[3], kw, spec["strides"][1], spec["pads"][1],
                                      spec["pads"][3], dx)
                op = "QAvgPool" if spec["op"] == "avgpool" else "QMaxPool"
                inputs, new_shape = (value,), (1, c, oh, ow)
                attrs = {"in_zp": zp, "kernel": (kh, kw), "strides": spec["strides"],
                         "pads": spec["pads"]}
                if spec.get("exclude_pad"):     # count_include_pad=0: per window count
                    real = rng.uniform(0.3, 1.0, c) / np.arange(1, kh * kw + 1)[:, None] \
                        * spec.get("gain", 1)
                    mult, shift = requant_params(real.reshape(-1), name)
                    consts = {f"{name}:m": mult.reshape(kh * kw, c),
                              f"{name}:s": shift.reshape(kh * kw, c)}
                    attrs["count_include_pad"] = False
                if spec.get("pad_q") is not None:
                    attrs["pad_q"] = int(spec["pad_q"])
                if spec["op"] == "maxpool":
                    attrs["dilations"] = (dy, dx)
                    if spec.get("identity"):          # the quantizer's exact copy
                        consts = {f"{name}:m": np.full(c, 1 << 30, np.int32),
                                  f"{name}:s": np.full(c, 30, np.int32)}
                        zp_out = zp
            else:
                other, other_shape, other_zp = history[spec["with"]]
                assert other_shape == shape
                op, inputs, new_shape = "QAdd", (value, other), shape
                attrs = {"wa": int(rng.integers(20, 128)), "wb": int(rng.integers(20, 128)),
                         "za": zp, "zb": other_zp}
            attrs.update(out_zp=zp_out, lo=-128, hi=127)
            constants.update(consts)
            for key, array in consts.items():
                types[key] = TensorType(str(array.dtype), array.shape)
            if spec.get("table"):
                attrs["table"] = tuple(int(v) for v in rng.integers(-128, 128, 256))
            nodes.append(Node(name, op, inputs + tuple(consts), (out,), attrs))
            zp, shape = zp_out, new_shape
        else:
            cin = shape[1]
            bits = spec.get("wbits", 8)
            lo, hi = (-127, 128) if bits == 8 else (-(1 << (bits - 1)), 1 << (bits - 1))
            if spec["op"] == "conv":
                kh, kw = spec["k"]
                group = spec.get("group", 1)
                w = rng.integers(lo, hi, (spec["cout"], cin // group, kh, kw)).astype(np.int8)
                oh = conv_output_size(shape[2], kh, spec["strides"][0], spec["pads"][0],
                                      spec["pads"][2], spec["dilations"][0])
                ow = conv_output_size(shape[3], kw, spec["strides"][1], spec["pads"][1],
                                      spec["pads"][3], spec["dilations"][1])
                new_shape, fan_in = (1, spec["cout"], oh, ow), cin // group * kh * kw
            else:
                w = rng.integers(lo, hi, (cin, spec["cout"])).astype(np.int8)
                new_shape, fan_in = (1, spec["cout"]), cin
            zp_out = int(rng.integers(-30, 30))
            mult, shift = requant_params(rng.uniform(0.5, 2.0, spec["cout"]) / (fan_in * 60.0)
                                         * spec.get("gain", 1), name)
            consts = {f"{name}:w": w, f"{name}:b": rng.integers(
                          -20000, 20000, spec["cout"]).astype(np.int32),
                      f"{name}:m": mult, f"{name}:s": shift}
            lo = max(-128, zp_out) if spec["relu"] else -128
            attrs = {"in_zp": zp, "out_zp": zp_out, "lo": lo,
                     "hi": max(lo, spec.get("hi", 127))}
            if spec.get("rounding"):
                attrs["rounding"] = spec["rounding"]
            if spec["op"] == "conv" and spec.get("pad_q") is not None:
                attrs["pad_q"] = int(spec["pad_q"])
            if spec["op"] == "conv":
                attrs.update(strides=spec["strides"], pads=spec["pads"],
                             dilations=spec["dilations"], group=spec.get("group", 1))
            if spec.get("table"):
                attrs["table"] = tuple(int(v) for v in rng.integers(-128, 128, 256))
            constants.update(consts)
            for key, array in consts.items():
                types[key] = TensorType(str(array.dtype), array.shape)
            nodes.append(Node(name, "QConv" if spec["op"] == "conv" else "QDense",
                              (value,) + tuple(consts), (out,), attrs))
            zp, shape = zp_out, new_shape
        types[out] = TensorType("int8", shape)
        value = out
        history[index] = (value, shape, zp)
    types["y"] = TensorType("float32", shape)
    nodes.append(Node("dequantize", "Dequantize", (value,), ("y",),
                      {"scale": 0.1, "zero_point": 0}))
    return Graph(nodes, ("x",), ("y",), types, constants)


# Hypothesis strategies ----------------------------------------------------------------------
#
# A case is ``(specs, input_shape, data_seed)``: ``chain_graph(np.random.default_rng(data_seed),
# specs, input_shape)`` is its graph. The strategies draw every structural choice (operator,
# shapes, kernels, strides, pads, dilations, groups, clamps, tables, padding values, rounding,
# scale gains) so that Hypothesis shrinks a failure to a small layer; the weights, biases and
# zero points come from ``data_seed``. Hypothesis is imported only when a strategy is made.

#: The operators of single-layer cases (``layer_cases``).
KINDS = ("conv", "depthwise", "grouped", "dense", "maxpool", "avgpool", "add", "concat")


def _st():
    from hypothesis import strategies
    return strategies


def _fit(size: int, k: int, d: int, begin: int, end: int, pool: bool):
    """Shrink a kernel (dilation first, then size; pooling pads stay below the kernel) until
    one window fits the padded input."""
    while (k - 1) * d + 1 > size + begin + end:
        if d > 1:
            d -= 1
        else:
            k -= 1
            if pool:
                begin, end = min(begin, k - 1), min(end, k - 1)
    return k, d, begin, end


def _draw_extras(draw, st, spec: dict, *, ort: bool, padded: bool = False) -> None:
    """Options shared by several operators: activation table, requantization gain, and for
    conv/dense an upper clamp and onnxruntime rounding, for conv/pooling a padding value."""
    spec["table"] = draw(st.sampled_from([False, False, False, True]))
    spec["gain"] = draw(st.sampled_from([1, 1, 0.25, 4.0, 1 / 16, 16.0]))
    if spec["op"] in ("conv", "dense"):
        spec["hi"] = draw(st.one_of(st.just(127), st.integers(-128, 127)))
        if ort:
            spec["rounding"] = draw(st.sampled_from([None, "ort"]))
    if padded:
        spec["pad_q"] = draw(st.one_of(st.none(), st.integers(-128, 127)))


def _draw_layer(draw, st, kind: str, shape: tuple, history: dict, ort: bool):
    """One layer spec of ``kind`` on an input of ``shape``; returns it and its output
    shape. ``history`` maps spec index (-1: the graph input) to output shape."""
    if kind == "flatten":
        return dict(op="flatten"), (1, int(np.prod(shape[1:])))
    if kind == "dense":
        spec = dict(op="dense", cout=draw(st.integers(1, 32)), relu=draw(st.booleans()))
        _draw_extras(draw, st, spec, ort=ort)
        return spec, (1, spec["cout"])
    if kind in ("add", "concat"):
        if kind == "add":
            spec = dict(op="add", **{"with": draw(st.sampled_from(
                [i for i, s in history.items() if s == shape]))})
            out = shape
        else:
            same = [i for i, s in history.items() if len(s) == len(shape) and s[2:] == shape[2:]]
            spec = dict(op="concat", **{"with": draw(st.lists(st.sampled_from(same), min_size=1,
                                                              max_size=2))})
            out = (1, shape[1] + sum(history[i][1] for i in spec["with"])) + shape[2:]
        _draw_extras(draw, st, spec, ort=ort)
        return spec, out
    _, c, h, w = shape
    if kind in ("conv", "depthwise", "grouped"):
        if kind == "conv":
            group, cout = 1, draw(st.integers(1, 16))
        elif kind == "depthwise":
            group, cout = c, c * draw(st.sampled_from([1, 2]))
        else:
            group = draw(st.sampled_from([g for g in range(1, c + 1) if c % g == 0]))
            cout = group * draw(st.integers(1, max(1, 16 // group)))
        k = [draw(st.integers(1, 4)), draw(st.integers(1, 4))]
        strides = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        pads = [draw(st.integers(0, 3)) for _ in range(4)]
        d = [draw(st.sampled_from([1, 1, 2, 3])), draw(st.sampled_from([1, 1, 2, 3]))]
        k[0], d[0], pads[0], pads[2] = _fit(h, k[0], d[0], pads[0], pads[2], False)
        k[1], d[1], pads[1], pads[3] = _fit(w, k[1], d[1], pads[1], pads[3], False)
        spec = dict(op="conv", cout=cout, k=tuple(k), strides=strides, pads=tuple(pads),
                    dilations=tuple(d), relu=draw(st.booleans()), group=group)
        _draw_extras(draw, st, spec, ort=ort, padded=True)
    else:                                                   # maxpool / avgpool
        if draw(st.sampled_from([False, False, False, True])):        # global
            k, strides, pads, d = [h, w], (1, 1), [0, 0, 0, 0], [1, 1]
        else:
            k = [draw(st.integers(1, 4)), draw(st.integers(1, 4))]
            strides = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
            pads = [draw(st.integers(0, k[i % 2] - 1)) for i in range(4)]
            d = [1, 1]
            if kind == "maxpool":
                d = [draw(st.sampled_from([1, 1, 2])), draw(st.sampled_from([1, 1, 2]))]
            k[0], d[0], pads[0], pads[2] = _fit(h, k[0], d[0], pads[0], pads[2], True)
            k[1], d[1], pads[1], pads[3] = _fit(w, k[1], d[1], pads[1], pads[3], True)
        spec = dict(op=kind, k=tuple(k), strides=strides, pads=tuple(pads))
        if kind == "maxpool":
            spec.update(dilations=tuple(d), identity=draw(st.booleans()))
            padded = True
        else:
            spec["exclude_pad"] = draw(st.booleans())
            padded = not spec["exclude_pad"]
        _draw_extras(draw, st, spec, ort=ort, padded=padded)
        if kind == "maxpool" and spec["identity"]:
            spec["table"], spec["gain"] = False, 1
        cout = c
    d = spec.get("dilations", (1, 1))
    oh = conv_output_size(h, spec["k"][0], spec["strides"][0], spec["pads"][0], spec["pads"][2],
                          d[0])
    ow = conv_output_size(w, spec["k"][1], spec["strides"][1], spec["pads"][1], spec["pads"][3],
                          d[1])
    assert oh >= 1 and ow >= 1, spec
    return spec, (1, cout, oh, ow)


def _draw_image(draw, st, channels: int = 16, side: int = 10) -> tuple:
    return (1, draw(st.integers(1, channels)), draw(st.integers(1, side)),
            draw(st.integers(1, side)))


def layer_cases(*, ort_rounding: bool = False, first_kind: int = 0):
    """Single-layer cases: one operator of :data:`KINDS` (``first_kind`` rotates the list, so
    that Hypothesis's simplest example, which it runs first, differs between seed blocks) on
    an image of 1-16 channels and 1-10 pixel sides (a vector of 1-48 for dense layers; add and
    concat also on vectors, of the input with itself). ``ort_rounding``: conv and dense layers
    may round as onnxruntime does."""
    st = _st()
    kinds = KINDS[first_kind % len(KINDS):] + KINDS[:first_kind % len(KINDS)]

    @st.composite
    def case(draw):
        kind = draw(st.sampled_from(kinds))
        image = kind not in ("dense",) and (kind not in ("add", "concat")
                                            or draw(st.booleans()))
        shape = _draw_image(draw, st) if image else (1, draw(st.integers(1, 48)))
        spec, _ = _draw_layer(draw, st, kind, shape, {-1: shape}, ort_rounding)
        return [spec], shape, draw(st.integers(0, 2 ** 32 - 1))

    return case()


def graph_cases(*, ort_rounding: bool = False, max_layers: int = 6, first_kind: int = 0):
    """Networks of 2-``max_layers`` random layers in a chain, with residual adds and concats
    of earlier outputs of the same shape, flattening into dense layers: each layer's operator
    is drawn among those its input allows (``first_kind`` rotates the choices)."""
    st = _st()

    def rotated(options):
        at = first_kind % len(options)
        return options[at:] + options[:at]

    @st.composite
    def case(draw):
        image = draw(st.sampled_from(rotated([True, True, True, False])))
        shape = _draw_image(draw, st, 12, 10) if image else (1, draw(st.integers(1, 48)))
        history, specs = {-1: shape}, []
        for index in range(draw(st.integers(2, max_layers))):
            if len(shape) == 4:
                kinds = ["conv", "depthwise", "grouped", "maxpool", "avgpool", "add",
                         "concat"] + (["flatten"] if np.prod(shape[1:]) <= 192 and specs
                                      else [])
            else:
                kinds = ["dense", "dense", "add", "concat"]
            if len(shape) == 4 and shape[1] > 24:           # keep the buffers small
                kinds = [k for k in kinds if k != "concat"]
            spec, shape = _draw_layer(draw, st, draw(st.sampled_from(rotated(kinds))),
                                      shape, history, ort_rounding)
            specs.append(spec)
            history[index] = shape
        return specs, history[-1], draw(st.integers(0, 2 ** 32 - 1))

    return case()
