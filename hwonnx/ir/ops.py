"""The operator registry: what hwonnx knows about each operator kind, in one place.

Two vocabularies, one entry per operator each:

* :data:`ONNX_OPS`: every ai.onnx operator the frontend reads, and how (mapped onto the float IR
  on run-time values, folded away on constants, run on the host at the start or the end of the
  graph), with the inputs that must be constants;
* :data:`IR_OPS`: every op of the float IR (``docs/ir.md``), its kind (an array layer, a
  layout op, a table function, an op the float pipeline must fuse away, a host step), the
  integer op the quantizer turns it into and why that op runs where it does.

Every stage's own table is derived from these (the frontend's supported operators, the
host-step rules, the passes' layer and layout ops, the quantizer's and the compiler's op lists,
the build report's placement reasons), and ``tests/ir/test_registry.py`` checks that each stage's
code table (converters, float functions, quantizers, golden functions, lowerings) covers
exactly the registry's entries of its kind. Each stage keeps its code for an operator in its
own folder; ``docs/adding-an-operator.md`` is the checklist. The table operators (any function
of one int8 value) have their own list, :data:`hwonnx.ir.tables.TABLE_OPS`, folded in here.
"""

from dataclasses import dataclass, field
from types import MappingProxyType

from .tables import TABLE_OPS

__all__ = ["OnnxOp", "IrOp", "ONNX_OPS", "IR_OPS", "LAYER", "LAYOUT", "TABLE", "FUSED", "HOST",
           "BOUNDARY", "onnx_ops", "ir_ops", "integer_ops", "keeps_input_params"]

# Kinds of float IR ops.
LAYER = "layer"        # an array layer: quantized to ``quantized``, hosts a fused ReLU/clip and
#                        an activation table in its post-processing
LAYOUT = "layout"      # changes the shape, not the order of the data; keeps its name and its
#                        input's quantization parameters
TABLE = "table"        # a function of one value: a 256-entry table after the layer before it
FUSED = "fused"        # the float pass pipeline folds it into a layer; left over, it is refused
HOST = "host"          # a float32 step on the host, before the accelerator's input or after
#                        its output (:mod:`hwonnx.golden.host`)
BOUNDARY = "boundary"  # integer-graph only: the host's conversions at the accelerator's edges


@dataclass(frozen=True)
class OnnxOp:
    """How the frontend reads one ai.onnx operator.

    ``compute``: mapped onto the float IR on run-time values (by
    :data:`hwonnx.frontend.convert.CONVERTERS`); ``foldable``: accepted on constants only
    (constant folding removes it);
    ``host_start`` / ``host_end``: the host may run it in the graph's leading chain / at its
    end (:mod:`hwonnx.frontend.host`); ``host_middle``: anywhere else too, as a host step
    between two accelerator segments (its float32 output is quantized again);
    ``constant_inputs``: input position -> role of the
    inputs that must be constants when the node is mapped; ``pair``: also mapped, by the
    element-wise engine, when both its inputs are computed (``Sub``)."""
    compute: bool = False
    foldable: bool = False
    host_start: bool = False
    host_end: bool = False
    host_middle: bool = False
    constant_inputs: "dict[int, str]" = field(default_factory=dict)
    pair: bool = False

    @property
    def host_only(self) -> bool:
        """No hardware mapping on run-time values: only the host can run it, at the start or
        the end of the graph (and, ``host_middle``, between accelerator segments)."""
        return not self.compute and (self.host_start or self.host_end)


@dataclass(frozen=True)
class IrOp:
    """One float IR op (or integer-only op, kind :data:`BOUNDARY`): its kind, the integer op
    the quantizer makes of it (a layer's ``Q...`` op; a layout op keeps its name), where that
    integer op runs and why (the build report's placement), and ``windowed``: it has a kernel,
    strides and pads (a ``Pad`` before it can fold into its padding), and ``copy``: its
    output holds values of its input, so it keeps its input's quantization parameters
    (:func:`keeps_input_params`)."""
    kind: str
    quantized: "str | None" = None
    where: str = "hardware"
    why: str = ""
    windowed: bool = False
    copy: bool = False


_LAYOUT_ONLY = "layout only: the buffer is read in another order"

IR_OPS: "MappingProxyType[str, IrOp]" = MappingProxyType({
    "Conv": IrOp(LAYER, "QConv", why="convolution on the systolic array", windowed=True),
    "Dense": IrOp(LAYER, "QDense", why="matrix multiply on the systolic array"),
    "ConvTranspose": IrOp(LAYER, "QConvTranspose", why="transposed convolution (or nearest "
                          "upsampling): one convolution per output phase, its POSTs writing "
                          "every stride-th pixel"),
    # A residual Add is a QEltwise sum on the element-wise engine; QAdd where the architecture or
    # the operands' layout leaves the engine out (hwonnx/quant/residual.py).
    "Add": IrOp(LAYER, "QAdd", why="residual sum without the element-wise engine: a 1x1 "
                "convolution over both inputs, weighted by int8 integers"),
    "AvgPool": IrOp(LAYER, "QAvgPool", windowed=True,
                    why="average pooling: a depthwise convolution with weights of one"),
    "MaxPool": IrOp(LAYER, "QMaxPool", copy=True, windowed=True,
                    why="max pooling: one tap per pass, the accumulators keep the maximum"),
    "Concat": IrOp(LAYER, "QConcat", why="concatenation, each source requantized by its own "
                   "multiplier: along channels a block-diagonal 1x1 convolution, along height "
                   "or width one copy per source"),
    "Eltwise": IrOp(LAYER, "QEltwise", why="element-wise engine: each input rescaled by its "
                    "own scale, requantized once by the post-processor"),
    "Permute": IrOp(LAYER, "QPermute", why="a Transpose that moves data: copies of the input's "
                    "rows or channels, each written with strides to its place", copy=True),
    "ChannelPermute": IrOp(LAYER, "QChannelPermute", why="a channel shuffle (Reshape, Transpose, "
                           "Reshape that permute whole channels): a 1x1 copy whose weights are "
                           "a 0/1 permutation matrix, requantized by the identity", copy=True),
    "Slice": IrOp(LAYER, "QSlice", why="a window of the input (Slice, an output of Split): a "
                  "1x1 copy selecting its channels, the window starting inside the input",
                  copy=True),
    "Flatten": IrOp(LAYOUT, "Flatten", why=_LAYOUT_ONLY),
    "Reshape": IrOp(LAYOUT, "Reshape", why=_LAYOUT_ONLY),
    "Relu": IrOp(FUSED), "Clip": IrOp(FUSED), "BatchNorm": IrOp(FUSED),
    "Identity": IrOp(FUSED), "Pad": IrOp(FUSED),
    "Softmax": IrOp(HOST, "Softmax", "host",
                    "no array mapping; runs in NumPy after the accelerator's output"),
    **{op: IrOp(HOST, op, "host", "host operator") for op in (
        "Sub", "Div", "Mul", "Transpose", "Cast", "LogSoftmax", "ArgMax", "TopK")},
    "LayerNorm": IrOp(HOST, "LayerNorm", "host", "no engine yet: float32 NumPy on the host "
                      "(its integer definition: hwonnx.golden.layernorm)"),
    "Gather": IrOp(HOST, "Gather", "host", "a pick of tokens (the class token) from a value "
                   "the host holds: float32 NumPy on the host"),
    **{op: IrOp(TABLE) for op in TABLE_OPS},
    "Quantize": IrOp(BOUNDARY, "Quantize", "host",
                     "converts the float input to int8 before it is sent"),
    "Dequantize": IrOp(BOUNDARY, "Dequantize", "host", "converts the int8 result back to float"),
})

#: Operators folded on constants only, beyond ``Constant``, ``Shape``, ``Cast``, ``Div`` and
#: ``Sub``: what exporters write to compute shapes and constant tensors.
_SHAPE_ARITHMETIC = ("ConstantOfShape", "Equal", "Where", "Expand", "Range", "Less",
                     "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Size",
                     "Tile", "Mod", "ReduceProd", "ReduceSum", "ReduceMin", "EyeLike", "Trilu",
                     "CumSum")

_LAYOUT_NODES = dict(compute=True, host_start=True, host_end=True)

ONNX_OPS: "MappingProxyType[str, OnnxOp]" = MappingProxyType({
    "Conv": OnnxOp(compute=True, constant_inputs={1: "weight", 2: "bias"}),
    "ConvTranspose": OnnxOp(compute=True, constant_inputs={1: "weight", 2: "bias"}),
    "Resize": OnnxOp(compute=True, constant_inputs={1: "roi", 2: "scales", 3: "sizes"}),
    "Upsample": OnnxOp(compute=True, constant_inputs={1: "scales"}),
    "DepthToSpace": OnnxOp(compute=True),
    "Gemm": OnnxOp(compute=True, constant_inputs={1: "B", 2: "C"}),
    "MatMul": OnnxOp(compute=True, constant_inputs={1: "second operand"}),
    "Add": OnnxOp(compute=True, host_start=True),
    "Mul": OnnxOp(compute=True, host_start=True),
    "Relu": OnnxOp(compute=True),
    "Clip": OnnxOp(compute=True, constant_inputs={1: "min", 2: "max"}),
    "BatchNormalization": OnnxOp(compute=True, constant_inputs={
        1: "scale", 2: "B", 3: "input_mean", 4: "input_var"}),
    "AveragePool": OnnxOp(compute=True),
    "GlobalAveragePool": OnnxOp(compute=True),
    "MaxPool": OnnxOp(compute=True),
    "GlobalMaxPool": OnnxOp(compute=True),
    **{op: OnnxOp(compute=True, constant_inputs={1: "axes"}) for op in ("ReduceMean",
                                                                        "ReduceMax")},
    "Concat": OnnxOp(compute=True),
    **{op: OnnxOp(compute=True) for op in ("Max", "Min", "Sum", "Mean")},
    "PRelu": OnnxOp(compute=True, constant_inputs={1: "slope"}),
    "Slice": OnnxOp(compute=True, constant_inputs={1: "starts", 2: "ends", 3: "axes",
                                                   4: "steps"}),
    "Split": OnnxOp(compute=True, constant_inputs={1: "split"}),
    "Pad": OnnxOp(compute=True, constant_inputs={1: "pads", 2: "constant_value", 3: "axes"}),
    "Flatten": OnnxOp(**_LAYOUT_NODES),
    "Reshape": OnnxOp(**_LAYOUT_NODES, constant_inputs={1: "shape"}),
    "Squeeze": OnnxOp(**_LAYOUT_NODES, constant_inputs={1: "axes"}),
    "Unsqueeze": OnnxOp(**_LAYOUT_NODES, constant_inputs={1: "axes"}),
    "Transpose": OnnxOp(**_LAYOUT_NODES),
    "Identity": OnnxOp(**_LAYOUT_NODES),
    "Dropout": OnnxOp(**_LAYOUT_NODES),
    "Sub": OnnxOp(foldable=True, host_start=True, host_middle=True, pair=True),
    "Div": OnnxOp(foldable=True, host_start=True, host_middle=True),
    "Cast": OnnxOp(foldable=True, host_start=True, host_middle=True),
    "Softmax": OnnxOp(host_end=True, host_middle=True),
    "LogSoftmax": OnnxOp(host_end=True, host_middle=True),
    "ArgMax": OnnxOp(host_end=True, host_middle=True),
    "TopK": OnnxOp(host_end=True, host_middle=True),
    "LayerNormalization": OnnxOp(host_end=True, host_middle=True),
    "Constant": OnnxOp(foldable=True),
    "Shape": OnnxOp(foldable=True),
    # A Gather of a computed tensor by a constant run of consecutive indices is a Slice (the
    # class token of a vision transformer, x[:, 0]); any other Gather is folded.
    "Gather": OnnxOp(compute=True, constant_inputs={1: "index tensor"}),
    # The shape arithmetic and constant tensors exporters write (torch.onnx's class token:
    # ConstantOfShape -> Mul -> Equal -> Where -> Expand; position ids: Range): folded.
    **{op: OnnxOp(foldable=True) for op in _SHAPE_ARITHMETIC},
    **{op: OnnxOp(compute=True) for op, table in TABLE_OPS.items() if table.onnx},
})


def onnx_ops(**flags) -> frozenset:
    """The ONNX operators whose entries have every given flag (``compute=True``,
    ``host_only=True``, ...)."""
    return frozenset(op for op, entry in ONNX_OPS.items()
                     if all(getattr(entry, k) == v for k, v in flags.items()))


def keeps_input_params(node) -> bool:
    """Whether the float IR node ``node`` keeps its input's quantization parameters: a copy
    of its values (an op whose entry has ``copy``, or a layer the passes made as a copy,
    attribute ``copy``)."""
    entry = IR_OPS.get(node.op)
    return bool(entry is not None and entry.copy or node.attrs.get("copy"))


def ir_ops(*kinds: str) -> frozenset:
    """The float IR ops of the given kinds."""
    return frozenset(op for op, entry in IR_OPS.items() if entry.kind in kinds)


def integer_ops(*kinds: str) -> "tuple[str, ...]":
    """The integer ops made of the float IR ops of the given kinds, in registry order."""
    return tuple(entry.quantized for entry in IR_OPS.values()
                 if entry.kind in kinds and entry.quantized)
