"""Seeded random integer graphs (Quantize -> layers -> Dequantize) for RTL tests."""

import numpy as np

from hwonnx.golden.im2col import conv_output_size
from hwonnx.ir import Graph, Node, TensorType
from hwonnx.quant import requant_params

__all__ = ["random_conv_spec", "random_dense_spec", "chain_graph"]


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
    current value. Conv specs may have a ``group``; any layer spec with ``table`` gets a
    random activation table. Layer shapes follow from
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
        elif spec["op"] in ("avgpool", "maxpool", "add"):
            zp_out = int(rng.integers(-30, 30))
            c = shape[1]
            mult, shift = requant_params(rng.uniform(0.3, 1.0, c) / 4, name)
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
                    real = rng.uniform(0.3, 1.0, c) / np.arange(1, kh * kw + 1)[:, None]
                    mult, shift = requant_params(real.reshape(-1), name)
                    consts = {f"{name}:m": mult.reshape(kh * kw, c),
                              f"{name}:s": shift.reshape(kh * kw, c)}
                    attrs["count_include_pad"] = False
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
            if spec["op"] == "conv":
                kh, kw = spec["k"]
                group = spec.get("group", 1)
                w = rng.integers(-127, 128, (spec["cout"], cin // group, kh, kw)).astype(np.int8)
                oh = conv_output_size(shape[2], kh, spec["strides"][0], spec["pads"][0],
                                      spec["pads"][2], spec["dilations"][0])
                ow = conv_output_size(shape[3], kw, spec["strides"][1], spec["pads"][1],
                                      spec["pads"][3], spec["dilations"][1])
                new_shape, fan_in = (1, spec["cout"], oh, ow), cin // group * kh * kw
            else:
                w = rng.integers(-127, 128, (cin, spec["cout"])).astype(np.int8)
                new_shape, fan_in = (1, spec["cout"]), cin
            zp_out = int(rng.integers(-30, 30))
            mult, shift = requant_params(rng.uniform(0.5, 2.0, spec["cout"]) / (fan_in * 60.0),
                                         name)
            consts = {f"{name}:w": w, f"{name}:b": rng.integers(
                          -20000, 20000, spec["cout"]).astype(np.int32),
                      f"{name}:m": mult, f"{name}:s": shift}
            attrs = {"in_zp": zp,
                     "out_zp": zp_out, "lo": max(-128, zp_out) if spec["relu"] else -128,
                     "hi": 127}
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
