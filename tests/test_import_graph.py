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


def import_graph() -> dict[str, set[str]]:
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
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in typing_only:
                edges |= _targets(node, module, is_package, modules)
        graph[module] = edges - {module}
    return graph


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
    graph = import_graph()
    assert "hf_dspark.profiling" in graph["hf_dspark.generation.policy"]  # imported inside policy_from_config
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
    "hf_dspark.profiling",
)


def test_modeling_dspark_imports_nothing_above_it():
    """The drafter reaches loading, the Hub shim and `generate` routing through `drafter_hooks`, never by import."""
    graph = import_graph()
    above = sorted(m for m in reachable(graph, "hf_dspark.modeling_dspark") if m.startswith(ABOVE_MODELING))
    assert above == [], f"hf_dspark.modeling_dspark loads {above}"
    assert "hf_dspark" not in reachable(graph, "hf_dspark.modeling_dspark")
