"""Check a model against the model-level rules of the ONNX IR specification ("Models",
"Operator Sets", "Operators", "Optional Metadata", "Training Related Information") and run the
graph rules of :mod:`.graph_rules` on its main graph."""

import functools
from collections import Counter

import onnx

from ..errors import ModelError
from .common import (
    FLOAT_TYPES,
    ReadLog,
    elem_type_name,
    graph_attributes,
    is_default_domain,
    subgraphs,
)
from .graph_rules import check_graph, name_nodes

#: Integer graph input types a ``Cast`` to float may read, on the host (exact in float32).
CASTABLE_INPUT_TYPES = frozenset({onnx.TensorProto.UINT8, onnx.TensorProto.INT8,
                                  onnx.TensorProto.UINT16, onnx.TensorProto.INT16,
                                  onnx.TensorProto.INT32})

__all__ = ["name_nodes", "validate_model", "resolve_operators", "newest_opsets"]

#: The first IR version with ``opset_import``; older models implicitly use ai.onnx opset 1.
FIRST_OPSET_IR = 3
#: Repeated metadata keys are warned about one by one up to this many, then summarized.
_LISTED_KEYS = 3


@functools.lru_cache(maxsize=None)
def newest_opsets() -> "dict[str, int]":
    """Map each domain the installed onnx defines operators for to its newest version."""
    newest: "dict[str, int]" = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        newest[schema.domain] = max(newest.get(schema.domain, 0), schema.since_version)
    newest[""] = onnx.defs.onnx_opset_version()
    return newest


def _domain_label(domain: str) -> str:
    return domain or "ai.onnx"


def validate_model(model: onnx.ModelProto, rlog: ReadLog) -> None:
    """Check versions, operator set imports, metadata, training information, the graph
    signature and value namespace (SSA, topological order, no cycles) and attributes. The
    operators are resolved separately, by :func:`resolve_operators`.

    Parameters
    ----------
    model : onnx.ModelProto
        A private copy. It is changed only to name unnamed nodes ``<op_type>_<index>``, to
        spell the default domain ``''``, to type the attributes of IR version 1 and to make
        the opset implied by IR versions 1 and 2 explicit.
    rlog : ReadLog
        Receives notes and the warnings for tolerated deviations.

    Raises
    ------
    ModelError
        If the model breaks a rule; the message names the rule and the node or value.
    """
    _check_versions(model, rlog)
    _normalize_domains(model)
    if model.ir_version < 2:
        _type_attributes(model)
    _check_metadata(model, rlog)
    _check_training_info(model, rlog)
    name_nodes(model.graph.node)
    check_graph(model.graph, rlog)
    initialized = {i.name for i in model.graph.initializer} | \
        {s.values.name for s in model.graph.sparse_initializer}
    for value in model.graph.input:
        elem = value.type.tensor_type.elem_type
        if value.name in initialized or elem in FLOAT_TYPES:
            continue
        readers = [n for n in model.graph.node if value.name in n.input]
        castable = elem in CASTABLE_INPUT_TYPES
        if castable and readers and all(n.op_type == "Cast" and n.domain == "" for n in readers):
            continue                             # a host step converts it (frontend/host.py)
        raise ModelError(f"Graph input '{value.name}' must be float32, float16, bfloat16 or "
                         f"float64, not {elem_type_name(elem)}" + (
                             ", unless only a Cast to float reads it (a host step)"
                             if castable else ""))


def _check_versions(model: onnx.ModelProto, rlog: ReadLog) -> None:
    version = model.ir_version
    if not model.HasField("ir_version") or version == 0:
        raise ModelError("Model must set ir_version (ONNX IR: every ModelProto names the IR "
                         "version it follows)")
    if version < 0:
        raise ModelError(f"Model ir_version must be a published IR version (1 to "
                         f"{onnx.IR_VERSION}), not {version}")
    if version > onnx.IR_VERSION:
        raise ModelError(f"Model ir_version {version} is newer than {onnx.IR_VERSION}, the newest "
                         f"version onnx {onnx.__version__} reads; upgrade onnx or re-export the "
                         f"model with ir_version {onnx.IR_VERSION} or older")
    if not model.opset_import:
        if version >= FIRST_OPSET_IR:
            raise ModelError("Model must have an opset_import (ONNX IR: a model names every "
                             "operator set it uses)")
        model.opset_import.add(domain="", version=1)
        rlog.note(f"ir_version {version} predates opset_import; read as ai.onnx opset 1, which "
                  f"such models implicitly import")
    seen = set()
    newest = newest_opsets()
    for opset in model.opset_import:
        domain = "" if is_default_domain(opset.domain) else opset.domain
        if domain in seen:
            raise ModelError(f"Model opset_import imports domain '{_domain_label(domain)}' twice "
                             f"(ONNX IR: operator set domains must be unique)")
        seen.add(domain)
        if opset.version < 1:
            raise ModelError(f"Model opset_import gives domain '{_domain_label(domain)}' version "
                             f"{opset.version}; operator set versions start at 1")
        if domain in newest and opset.version > newest[domain]:
            raise ModelError(f"Model imports {_domain_label(domain)} opset {opset.version}, "
                             f"newer than {newest[domain]}, the newest onnx {onnx.__version__} "
                             f"knows; upgrade onnx or re-export the model with opset "
                             f"{newest[domain]} or older")


def _normalize_domains(model: onnx.ModelProto) -> None:
    """Spell the default domain ``''`` everywhere (``'ai.onnx'`` is its alias), in place."""
    for opset in model.opset_import:
        if opset.domain == "ai.onnx":
            opset.domain = ""
    bodies = [g.node for g in subgraphs(model.graph)] + [f.node for f in model.functions]
    for function in model.functions:
        for opset in function.opset_import:
            if opset.domain == "ai.onnx":
                opset.domain = ""
        for node in function.node:
            for _, graph in graph_attributes(node):
                bodies += [g.node for g in subgraphs(graph)]
    for nodes in bodies:
        for node in nodes:
            if node.domain == "ai.onnx":
                node.domain = ""


_SINGLE_FIELDS = {"f": "FLOAT", "i": "INT", "s": "STRING", "t": "TENSOR", "g": "GRAPH"}
_LIST_FIELDS = {"floats": "FLOATS", "ints": "INTS", "strings": "STRINGS", "tensors": "TENSORS",
                "graphs": "GRAPHS"}


def _type_attributes(model: onnx.ModelProto) -> None:
    """IR version 1 had no attribute type: derive it from the one value field that is set."""
    for graph in subgraphs(model.graph):
        for node in graph.node:
            for attr in node.attribute:
                present = [kind for field, kind in _SINGLE_FIELDS.items() if attr.HasField(field)]
                present += [kind for field, kind in _LIST_FIELDS.items()
                            if len(getattr(attr, field))]
                if attr.type == onnx.AttributeProto.UNDEFINED and len(present) == 1:
                    attr.type = onnx.AttributeProto.AttributeType.Value(present[0])


def _check_metadata(model: onnx.ModelProto, rlog: ReadLog) -> None:
    counts = Counter(p.key for p in model.metadata_props)
    repeated = [(key, n) for key, n in counts.items() if n > 1]
    if len(repeated) <= _LISTED_KEYS:
        for key, n in repeated:
            rlog.warn(f"metadata_props key '{key}' appears {n} times; the last value is used "
                      f"(ONNX IR: metadata keys should be distinct)")
        return
    shown = ", ".join(f"'{key}' ({n} times)" for key, n in repeated[:_LISTED_KEYS])
    rlog.warn(f"{len(repeated)} metadata_props keys appear more than once ({shown} and "
              f"{len(repeated) - _LISTED_KEYS} more); the last value of each is used (ONNX IR: "
              f"metadata keys should be distinct)")


def _check_training_info(model: onnx.ModelProto, rlog: ReadLog) -> None:
    main = {i.name for i in model.graph.initializer}
    for index, info in enumerate(model.training_info):
        where = f"training_info[{index}]"
        inits = main | {i.name for i in info.algorithm.initializer}
        for field, graph in (("initialization_binding", info.initialization),
                             ("update_binding", info.algorithm)):
            bindings = getattr(info, field)
            if field == "initialization_binding" and bindings and \
                    not info.HasField("initialization"):
                raise ModelError(f"{where} has an initialization_binding but no initialization "
                                 f"graph (ONNX IR: initialization MAY be omitted only if there "
                                 f"are no initialization bindings)")
            outputs = {v.name for v in graph.output}
            keys = set()
            for binding in bindings:
                if binding.key in keys:
                    raise ModelError(f"{where} {field} binds '{binding.key}' twice (ONNX IR: "
                                     f"binding keys MUST be unique)")
                keys.add(binding.key)
                if binding.key not in inits:
                    raise ModelError(f"{where} {field} key '{binding.key}' must name an "
                                     f"initializer of the main graph or of the algorithm graph "
                                     f"(ONNX IR: binding keys MUST name initializers)")
                if binding.value not in outputs:
                    raise ModelError(f"{where} {field} value '{binding.value}' must name an "
                                     f"output of its graph (ONNX IR: binding values MUST name "
                                     f"outputs of the initialization or algorithm graph)")
    if model.training_info:
        rlog.note(f"Ignored training_info ({len(model.training_info)} entr"
                  f"{'y' if len(model.training_info) == 1 else 'ies'}): hwonnx runs inference "
                  f"only, as the ONNX IR allows")


def resolve_operators(model: onnx.ModelProto) -> None:
    """Check that every node's operator is declared by an imported operator set: a
    model-local function, or an operator that the imported version of a domain onnx knows
    defines. Operators of domains onnx does not know are left to the support check.

    Raises
    ------
    ModelError
        If a node's domain is not imported or its operator is not in the imported version.
    """
    opsets = {("" if is_default_domain(o.domain) else o.domain): o.version
              for o in model.opset_import}
    local = {(f.domain, f.name) for f in model.functions}
    for node in model.graph.node:
        _resolve(node, opsets, local, "")
    for function in model.functions:
        imported = dict(opsets)
        imported.update({("" if is_default_domain(o.domain) else o.domain): o.version
                         for o in function.opset_import})
        for node in function.node:
            _resolve(node, imported, local, f" in function '{function.domain}.{function.name}'")


def _resolve(node: onnx.NodeProto, opsets: "dict[str, int]", local, where: str) -> None:
    domain = "" if is_default_domain(node.domain) else node.domain
    if domain not in opsets:
        raise ModelError(f"Node '{node.name}'{where} uses {node.op_type} of domain "
                         f"'{_domain_label(domain)}', which the model's opset_import does not "
                         f"import (ONNX IR: each operator used MUST be declared by an imported "
                         f"operator set)")
    if (node.domain, node.op_type) in local or domain not in newest_opsets():
        return
    version = opsets[domain]
    if not 1 <= version <= newest_opsets()[domain]:
        raise ModelError(f"Node '{node.name}'{where} uses {_domain_label(domain)} opset "
                         f"{version}; onnx {onnx.__version__} knows opsets 1 to "
                         f"{newest_opsets()[domain]}")
    if not _defines(node.op_type, version, domain):
        first = _first_version(node.op_type, domain)
        hint = f"; it first appears in opset {first}" if first else ""
        raise ModelError(f"Node '{node.name}'{where} uses {node.op_type}, which "
                         f"{_domain_label(domain)} opset {version} does not define{hint} (ONNX "
                         f"IR: each operator used MUST be declared by an imported operator set)")


@functools.lru_cache(maxsize=4096)
def _defines(op_type: str, version: int, domain: str) -> bool:
    """Whether ``domain`` opset ``version`` defines ``op_type`` (cached: graphs repeat
    operators)."""
    try:
        onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return False
    return True


def _first_version(op_type: str, domain: str) -> int:
    """Return the opset version that introduced ``op_type`` (0 if no version defines it)."""
    try:
        schema = onnx.defs.get_schema(op_type, newest_opsets()[domain], domain)
    except onnx.defs.SchemaError:
        return 0
    while True:
        try:
            schema = onnx.defs.get_schema(op_type, schema.since_version - 1, domain)
        except onnx.defs.SchemaError:
            return schema.since_version
