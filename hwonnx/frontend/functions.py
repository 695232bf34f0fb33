"""Model-local functions (``ModelProto.functions``): checked against the rules for function
bodies, then inlined with onnx's inliner; inlined nodes are named ``<call>/<body node>``."""

import onnx
import onnx.inliner

from ..errors import ModelError
from .common import ReadLog, subgraphs
from .graph_rules import check_attributes, check_body, name_nodes
from .shapes import put_back_initializers, shape_skeleton

__all__ = ["check_functions", "inline_functions"]


def _key(function: onnx.FunctionProto) -> "tuple[str, str, str]":
    return (function.domain, function.name, function.overload)


def _label(function: onnx.FunctionProto) -> str:
    overload = f" (overload '{function.overload}')" if function.overload else ""
    return f"'{function.domain}.{function.name}'{overload}"


def _callee(node: onnx.NodeProto, functions: dict) -> "onnx.FunctionProto | None":
    return functions.get((node.domain, node.op_type, node.overload))


def check_functions(model: onnx.ModelProto) -> None:
    """Check every model-local function: a unique id, a body that follows the graph rules
    (SSA, topological order, defined outputs, well-formed attributes whose references name
    declared attribute parameters) and no recursion.

    Raises
    ------
    ModelError
        If a function breaks a rule; the message names the function and the node.
    """
    functions: "dict[tuple[str, str, str], onnx.FunctionProto]" = {}
    for function in model.functions:
        if not function.name:
            raise ModelError("Every model-local function must have a name (ONNX IR: a function "
                             "is identified by its domain and name)")
        if _key(function) in functions:
            raise ModelError(f"Model-local function {_label(function)} is defined twice (ONNX "
                             f"IR: domain, name and overload identify a function uniquely)")
        functions[_key(function)] = function
    for function in model.functions:
        scope = f"Function {_label(function)}: "
        params = set(function.attribute)
        defaults = {a.name for a in function.attribute_proto}
        if params & defaults:
            raise ModelError(f"{scope}attribute '{sorted(params & defaults)[0]}' is declared both "
                             f"with and without a default (ONNX IR: the names in attribute and "
                             f"attribute_proto must be distinct)")
        names = {}
        for index, node in enumerate(function.node):
            if not node.name:
                node.name = f"{node.op_type}_{index}"
            if node.name in names:
                node.name = f"{node.name}_{index}"
            names[node.name] = index
            check_attributes(node, f" in function {_label(function)}", in_function=True)
            for attr in node.attribute:
                if attr.ref_attr_name and attr.ref_attr_name not in params | defaults:
                    raise ModelError(f"{scope}node '{node.name}' refers to attribute "
                                     f"'{attr.ref_attr_name}', which the function does not "
                                     f"declare")
        defined = {value: "a function input" for value in function.input if value}
        check_body(function.node, defined, [v for v in function.output if v], scope,
                   output_role="Function output")
    for function in model.functions:
        _check_recursion(function, functions, [])


def _check_recursion(function, functions, path) -> None:
    if _key(function) in [_key(f) for f in path]:
        chain = " -> ".join(_label(f) for f in [*path, function])
        raise ModelError(f"Model-local function {chain} calls itself; functions must not be "
                         f"recursive")
    for node in function.node:
        callee = _callee(node, functions)
        if callee is not None:
            _check_recursion(callee, functions, [*path, function])


def _check_call(node: onnx.NodeProto, function: onnx.FunctionProto) -> None:
    if len(node.input) > len(function.input) or len(node.output) > len(function.output):
        raise ModelError(f"Node '{node.name}' calls function {_label(function)} with "
                         f"{len(node.input)} input(s) and {len(node.output)} output(s); it "
                         f"takes at most {len(function.input)} and {len(function.output)}")
    declared = set(function.attribute) | {a.name for a in function.attribute_proto}
    for attr in node.attribute:
        if attr.name not in declared:
            raise ModelError(f"Node '{node.name}' gives attribute '{attr.name}', which function "
                             f"{_label(function)} does not declare")


def _body_names(function, functions, prefix: str) -> "list[str]":
    names = []
    for node in function.node:
        callee = _callee(node, functions)
        if callee is None:
            names.append(prefix + node.name)
        else:
            names += _body_names(callee, functions, f"{prefix}{node.name}/")
    return names


def _typed(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return a copy of ``model`` whose values all have types: the inliner converts function
    bodies to the model's opset versions only when it knows the types of the call inputs."""
    typed = onnx.ModelProto()
    typed.CopyFrom(model)
    typed.ir_version = max(model.ir_version, 10)        # the inliner reads overloads (IR 10)
    try:
        typed = onnx.shape_inference.infer_shapes(typed)
    except Exception:                                   # the inliner reports its own error
        pass
    known = {v.name for v in (*typed.graph.value_info, *typed.graph.input)}
    typed.graph.value_info.extend(
        onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
        for init in typed.graph.initializer if init.name not in known)
    return typed


def inline_functions(model: onnx.ModelProto, rlog: ReadLog) -> onnx.ModelProto:
    """Return ``model`` with every call of a model-local function replaced by the function
    body (onnx's inliner, which also converts bodies to the model's opset versions), and no
    functions left. ``model`` is returned as is when it has no functions.

    Raises
    ------
    ModelError
        If a function breaks a rule, a call does not fit its function, or inlining fails.
    """
    if not model.functions:
        return model
    check_functions(model)
    functions = {_key(f): f for f in model.functions}
    calls = [(n, _callee(n, functions)) for g in subgraphs(model.graph) for n in g.node]
    calls = [(n, f) for n, f in calls if f is not None]
    for node, function in calls:
        _check_call(node, function)
    expected: "list[str]" = []
    for node in model.graph.node:
        callee = _callee(node, functions)
        expected += [node.name] if callee is None else \
            _body_names(callee, functions, f"{node.name}/")
    version = model.ir_version
    skeleton, moved = shape_skeleton(model)       # the inliner copies what it is given
    try:
        inlined = onnx.inliner.inline_local_functions(_typed(skeleton), convert_version=True)
    except Exception as error:                   # onnx's C++ inliner on user data
        text = " ".join(str(error).split())
        raise ModelError(f"Cannot inline the model-local functions: {text}") from error
    del skeleton
    put_back_initializers(inlined, model, moved)
    inlined.ir_version = version
    original = {v.name for v in model.graph.value_info}
    kept = [v for v in inlined.graph.value_info if v.name in original]
    del inlined.graph.value_info[:]
    inlined.graph.value_info.extend(kept)
    if len(inlined.graph.node) == len(expected):
        for node, name in zip(inlined.graph.node, expected):
            node.name = name
    else:                                        # version conversion added or removed nodes
        name_nodes(inlined.graph.node)
    del inlined.functions[:]
    if calls:
        used = ", ".join(dict.fromkeys(_label(f) for _, f in calls))
        rlog.note(f"Inlined {len(calls)} call(s) of model-local functions ({used})")
    else:
        unused = ", ".join(_label(f) for f in model.functions)
        rlog.note(f"Ignored model-local functions no node calls ({unused})")
    return inlined
