"""No import circle among hwonnx's modules: read from the ``import`` statements with ``ast``
(``hwonnx.hdl``, ``hwonnx.sim`` and ``hwonnx.boards`` are the ``hdl/``, ``sim/`` and
``boards/`` folders). Imports under ``if TYPE_CHECKING:`` are not run and do not count.

Circles the project accepts for now would be listed in ``KNOWN`` (it is empty: there are
none): the test fails when a new one appears, and when a known one is gone (then strike it
from the list)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"hwonnx": ROOT / "hwonnx", "hwonnx.hdl": ROOT / "hdl", "hwonnx.sim": ROOT / "sim",
            "hwonnx.boards": ROOT / "boards"}

#: Circles accepted for now, each as the sorted names of its modules: none.
KNOWN: "set[tuple[str, ...]]" = set()


def _modules() -> "dict[str, Path]":
    modules = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if package == "hwonnx" and parts[0] in ("hdl", "sim", "boards"):
                continue                    # not inside the hwonnx/ folder
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def _imported(node, module: str, is_package: bool) -> "list[str]":
    """The names ``node`` imports, absolute, most specific first."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = module if is_package else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    target = ".".join(p for p in (base if node.level else "", node.module or "") if p)
    return [f"{target}.{alias.name}" for alias in node.names] + [target]


def _statements(tree: ast.AST):
    """Every import statement of ``tree`` but those under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            yield from (n for child in node.orelse for n in _statements_of(child))
            continue
        yield from _statements_of(node)


def _statements_of(node: ast.AST):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        yield from _statements(node)


def _graph() -> "dict[str, set[str]]":
    modules = _modules()
    edges = {}
    for module, path in modules.items():
        deps = set()
        for node in _statements(ast.parse(path.read_text(), str(path))):
            for name in _imported(node, module, path.name == "__init__.py"):
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name:
                    if name != module:
                        deps.add(name)
                    break
        edges[module] = deps
    return edges


def _circles(edges: "dict[str, set[str]]") -> "set[tuple[str, ...]]":
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), set()
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(tuple(sorted(component)))
    return found


def test_the_graph_is_read():
    edges = _graph()
    assert "hwonnx.pipeline" in edges and "hwonnx.hdl.top" in edges
    assert "hwonnx.boards.top" in edges["hwonnx.report"]     # hwonnx.boards -> boards/
    assert "hwonnx.compiler.timing" in edges["hwonnx.sim.execute"]


def test_a_circle_is_found():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {("a", "b", "c")}


def test_no_new_import_circle():
    circles = _circles(_graph())
    assert circles - KNOWN == set()
    assert KNOWN - circles == set()
