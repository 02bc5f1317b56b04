"""The module import graph of hf_dspark has no cycle; function-local imports count, TYPE_CHECKING ones do not."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, tuple[Path, bool]]:
    modules = {}
    for path in (SRC / "hf_dspark").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def _targets(node: ast.AST, module: str, is_package: bool, modules) -> set[str]:
    """hf_dspark modules one import statement loads (`from pkg import sub` counts as pkg.sub only)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    subs = {f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in modules}
    if len(subs) < len(node.names) and source in modules:
        subs.add(source)
    return subs


def _nested(tree: ast.AST, kinds: tuple[type, ...], only_body: bool = False) -> set[int]:
    """ids of every node inside a node of `kinds` (only inside its `body` with `only_body`)."""
    return {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        for stmt in (node.body if only_body else [node])
        for inner in ast.walk(stmt)
        if inner is not node
    }


def _edges(local: bool) -> dict[str, set[str]]:
    """Each module's hf_dspark imports: all of them (`local=False`), or only those inside a function body."""
    modules = _modules()
    graph = {}
    for module, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for stmt in node.body
            for inner in ast.walk(stmt)
        }
        in_function = _nested(tree, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) if local else set()
        edges: set[str] = set()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in typing_only:
                continue
            if not local or id(node) in in_function:
                edges |= _targets(node, module, is_package, modules)
        graph[module] = edges - {module}
    return graph


def import_graph() -> dict[str, set[str]]:
    """module -> the hf_dspark modules it imports, at module level or inside functions."""
    return _edges(local=False)


def local_import_graph() -> dict[str, set[str]]:
    """module -> the hf_dspark modules it imports inside a function body only (deferred imports)."""
    return _edges(local=True)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path [a, b, ..., a], or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if state.get(root):
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            child = next(stack[-1], None)
            if child is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(child) == 1:
                return [*path[path.index(child) :], child]
            elif not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append(iter(sorted(graph[child])))
    return None


def test_the_checker_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_function_local_imports_are_edges():
    graph, local = import_graph(), local_import_graph()
    assert "hf_dspark.interop.loading" in graph["hf_dspark"]  # imported inside the root's `_load_drafter` hook
    assert "hf_dspark.interop.loading" in local["hf_dspark"]
    assert "hf_dspark.model.modeling_dspark" not in local["hf_dspark"]  # a module-level import
    assert len(graph) > 50


def test_hf_dspark_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def package_graph(graph: dict[str, set[str]], packages: tuple[str, ...]) -> dict[str, set[str]]:
    """`graph` with every module of each of `packages` merged into one node named after the package."""

    def node(module: str) -> str:
        return next((p for p in packages if module == p or module.startswith(p + ".")), module)

    merged: dict[str, set[str]] = {}
    for module, targets in graph.items():
        merged.setdefault(node(module), set()).update(node(t) for t in targets)
    return {name: targets - {name} for name, targets in merged.items()}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` loads, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for child in graph[todo.pop()] - seen:
            seen.add(child)
            todo.append(child)
    return seen


SCHEDULING, GENERATION = "hf_dspark.scheduling", "hf_dspark.generation"


def test_package_checker_finds_a_cycle_through_another_module():
    graph = {"p.a": {"x"}, "x": {"q.b"}, "q.b": {"p.c"}, "p.c": set()}
    assert find_cycle(graph) is None
    assert find_cycle(package_graph(graph, ("p", "q"))) == ["p", "x", "q", "p"]


def test_scheduling_and_generation_form_no_package_cycle():
    """generation reads policies from scheduling; nothing scheduling loads, however indirectly, is in generation."""
    graph = package_graph(import_graph(), (SCHEDULING, GENERATION))
    assert SCHEDULING in reachable(graph, GENERATION)
    assert GENERATION not in reachable(graph, SCHEDULING), (
        f"package cycle: {' -> '.join(find_cycle({k: v for k, v in graph.items()}) or [])}"
    )


ABOVE_MODELING = (
    "hf_dspark.generation",
    "hf_dspark.interop",
    "hf_dspark.scheduling",
    "hf_dspark.proposers",
    "hf_dspark.eval",
    "hf_dspark.training",
    "hf_dspark.cli",
    "hf_dspark.profiling.target_steps",
)


def test_modeling_dspark_imports_nothing_above_it():
    """The drafter reaches loading, the Hub shim and `generate` routing through `drafter_hooks`, never by import."""
    graph = import_graph()
    above = sorted(m for m in reachable(graph, "hf_dspark.model.modeling_dspark") if m.startswith(ABOVE_MODELING))
    assert above == [], f"hf_dspark.model.modeling_dspark loads {above}"
    assert "hf_dspark" not in reachable(graph, "hf_dspark.model.modeling_dspark")


ROOT = "hf_dspark"


def subpackages(graph: dict[str, set[str]]) -> tuple[str, ...]:
    """`hf_dspark.X` for every subpackage X (each merged into one node by `package_graph`)."""
    return tuple(sorted({".".join(m.split(".")[:2]) for m in graph if m.count(".") >= 2}))


def package_of(module: str, packages: tuple[str, ...]) -> str:
    return next((p for p in packages if module == p or module.startswith(p + ".")), module)


def test_subpackages_and_modules_form_no_cycle():
    """With every subpackage one node (the root and the top-level modules their own), the graph has no cycle:
    a cycle through two packages (`generation` -> `profiling` -> `generation`) fails even when no module-level
    cycle does."""
    graph = import_graph()
    cycle = find_cycle(package_graph(graph, subpackages(graph)))
    assert cycle is None, f"package-level import cycle: {' -> '.join(cycle)}"


def test_no_module_imports_the_package_root():
    """`hf_dspark/__init__.py` reaches every layer (its hooks); a module importing it would close a circle."""
    importers = sorted(m for m, targets in import_graph().items() if ROOT in targets)
    assert importers == [], f"{importers} import {ROOT} itself; import the module that defines the name instead"


def upward_local_imports(
    graph: dict[str, set[str]], local: dict[str, set[str]], packages: tuple[str, ...]
) -> list[str]:
    """Function-local imports `a -> b` where b (or b's package) loads a (or a's package): a deferred import that
    only hides a circle."""
    merged = package_graph(graph, packages)
    found = []
    for module, targets in sorted(local.items()):
        for target in sorted(targets):
            here, there = package_of(module, packages), package_of(target, packages)
            if here == there:
                upward = module in reachable(graph, target)
            else:
                upward = here in reachable(merged, there)
            if upward:
                found.append(f"{module} -> {target}")
    return found


def test_the_upward_checker_finds_a_deferred_import_back_into_a_package():
    graph = {"p.a": {"q.b"}, "q.b": set(), "q.c": {"p.d"}, "p.d": set()}
    assert upward_local_imports(graph, {"q.c": {"p.d"}}, ("p", "q")) == ["q.c -> p.d"]
    graph = {"p.a": {"q.b"}, "q.b": set(), "q.c": set(), "p.d": set()}
    assert upward_local_imports(graph, {"p.a": {"q.b"}}, ("p", "q")) == []
    graph = {"p.a": {"p.b"}, "p.b": {"p.a"}}
    assert upward_local_imports(graph, {"p.b": {"p.a"}}, ("p",)) == ["p.b -> p.a"]


def test_function_local_imports_point_down():
    """A deferred import may keep `import hf_dspark` light; it may not reach a layer that loads the importer."""
    graph = import_graph()
    upward = upward_local_imports(graph, local_import_graph(), subpackages(graph))
    assert upward == [], f"upward function-local imports: {upward}"
