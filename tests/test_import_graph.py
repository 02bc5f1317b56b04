"""The import graph of hf_dspark points one way: no cycle of modules or of packages, and the layers' nevers hold.

Every import counts: module level, inside functions (deferred) and under `if TYPE_CHECKING:` (a type-only import
still ties the two modules' designs together). The shipped drafters' remote-code shims under `resources/` are not
package modules (their folders are not importable names) and import the public API, so they are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "hf_dspark"
RESOURCES = "hf_dspark.resources"
MAX_ROOT_MODULES = 12
MAX_FOLDER_LINES = 3500
FORBIDDEN_GLOBALS = ("HOOKS", "CURVE_SOURCES")


def _modules() -> dict[str, tuple[Path, bool]]:
    modules = {}
    for path in (SRC / ROOT).rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        if name != RESOURCES and not name.startswith(RESOURCES + "."):
            modules[name] = (path, is_package)
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


def module_edges(tree: ast.AST, module: str, is_package: bool, modules, local: bool = False) -> set[str]:
    """The hf_dspark modules `tree` (module `module`) imports: every import statement, TYPE_CHECKING ones
    included, or with `local` only those inside a function body."""
    in_function = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for inner in ast.walk(node)
        if inner is not node
    }
    edges: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and (not local or id(node) in in_function):
            edges |= _targets(node, module, is_package, modules)
    return edges - {module}


def _edges(local: bool) -> dict[str, set[str]]:
    modules = _modules()
    return {
        module: module_edges(ast.parse(path.read_text(encoding="utf-8")), module, is_package, modules, local)
        for module, (path, is_package) in modules.items()
    }


def import_graph() -> dict[str, set[str]]:
    """module -> the hf_dspark modules it imports (module level, inside functions, under TYPE_CHECKING)."""
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
                stack.append(iter(sorted(graph.get(child, ()))))
    return None


def package_of(module: str, packages: tuple[str, ...]) -> str:
    return next((p for p in packages if module == p or module.startswith(p + ".")), module)


def package_graph(graph: dict[str, set[str]], packages: tuple[str, ...]) -> dict[str, set[str]]:
    """`graph` with every module of each of `packages` merged into one node named after the package."""
    merged: dict[str, set[str]] = {}
    for module, targets in graph.items():
        merged.setdefault(package_of(module, packages), set()).update(package_of(t, packages) for t in targets)
    return {name: targets - {name} for name, targets in merged.items()}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every node `start` loads, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for child in graph.get(todo.pop(), set()) - seen:
            seen.add(child)
            todo.append(child)
    return seen


def subpackages(graph: dict[str, set[str]]) -> tuple[str, ...]:
    """`hf_dspark.X` for every subpackage X (each merged into one node by `package_graph`)."""
    return tuple(sorted({".".join(m.split(".")[:2]) for m in graph if m.count(".") >= 2}))


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
            upward = module in reachable(graph, target) if here == there else here in reachable(merged, there)
            if upward:
                found.append(f"{module} -> {target}")
    return found


def _pkg(name: str) -> str:
    return f"{ROOT}.{name}"


LOOP = tuple(_pkg(p) for p in ("generation", "serving", "proposers"))
ABOVE_THE_NETWORK = tuple(_pkg(p) for p in ("interop", "eval", "training", "cli", "scheduling", "profiling", "target"))
# package -> the packages nothing it loads, however indirectly, may belong to
NEVERS = {
    _pkg("ops"): LOOP + ABOVE_THE_NETWORK + (_pkg("model"),),
    _pkg("model"): LOOP + ABOVE_THE_NETWORK,
    _pkg("scheduling"): (*LOOP, _pkg("target")),
    _pkg("profiling"): LOOP,
    # what adapts the target and the drafters the loop drives sit below the loop and the engine
    _pkg("target"): (_pkg("generation"), _pkg("serving"), _pkg("proposers")),
    _pkg("proposers"): (_pkg("generation"), _pkg("serving")),
    _pkg("generation"): (_pkg("serving"),),
}


def broken_nevers(graph: dict[str, set[str]], nevers: dict[str, tuple[str, ...]]) -> list[str]:
    """`module -> forbidden module` for every module of a package in `nevers` that loads (directly or through
    others) a module of one of the packages it must never reach."""
    found = []
    for module in sorted(graph):
        for package, forbidden in nevers.items():
            if module == package or module.startswith(package + "."):
                loaded = sorted(reachable(graph, module))
                found += [f"{module} -> {t}" for t in loaded if package_of(t, forbidden) != t]
    return found


# ---------------------------------------------------------------------------------------------- the checkers
def test_the_checker_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_type_checking_and_function_local_imports_are_edges():
    modules = {"p": (None, True), "p.a": (None, False), "p.b": (None, False), "p.c": (None, False)}
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .b import B\n"
        "def f():\n    from .c import C\n"
    )
    assert module_edges(tree, "p.a", False, modules) == {"p.b", "p.c"}
    assert module_edges(tree, "p.a", False, modules, local=True) == {"p.c"}


def test_package_checker_finds_a_cycle_through_another_module():
    graph = {"p.a": {"x"}, "x": {"q.b"}, "q.b": {"p.c"}, "p.c": set()}
    assert find_cycle(graph) is None
    assert find_cycle(package_graph(graph, ("p", "q"))) == ["p", "x", "q", "p"]


def test_the_nevers_checker_follows_indirect_imports():
    graph = {"low.a": {"mid"}, "mid": {"high.b"}, "high.b": set()}
    assert broken_nevers(graph, {"low": ("high",)}) == ["low.a -> high.b"]
    assert broken_nevers(graph, {"mid": ("low",)}) == []


def test_the_upward_checker_finds_a_deferred_import_back_into_a_package():
    graph = {"p.a": {"q.b"}, "q.b": set(), "q.c": {"p.d"}, "p.d": set()}
    assert upward_local_imports(graph, {"q.c": {"p.d"}}, ("p", "q")) == ["q.c -> p.d"]
    graph = {"p.a": {"q.b"}, "q.b": set(), "q.c": set(), "p.d": set()}
    assert upward_local_imports(graph, {"p.a": {"q.b"}}, ("p", "q")) == []
    graph = {"p.a": {"p.b"}, "p.b": {"p.a"}}
    assert upward_local_imports(graph, {"p.b": {"p.a"}}, ("p",)) == ["p.b -> p.a"]


# ---------------------------------------------------------------------------------------------- the package
def test_the_graph_sees_the_package():
    graph = import_graph()
    assert len(graph) > 50
    assert "hf_dspark.drafter" in graph["hf_dspark"]
    assert "hf_dspark.scheduling.records" in graph["hf_dspark.generation.stats"]


def test_hf_dspark_has_no_module_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_subpackages_and_root_modules_form_no_cycle():
    """With every subpackage one node (the root and its modules their own), the graph has no cycle: a cycle through
    two packages (`generation` -> `profiling` -> `generation`) fails even when no module-level cycle does."""
    graph = import_graph()
    cycle = find_cycle(package_graph(graph, subpackages(graph)))
    assert cycle is None, f"package-level import cycle: {' -> '.join(cycle)}"


def test_lower_layers_never_reach_the_layers_above():
    """ops and model reach nothing of the loop (generation, serving, proposers) nor of interop, eval, training,
    cli, scheduling, profiling, target; scheduling and profiling nothing of the loop (scheduling not the target's
    adapters either); target and proposers nothing of generation or serving; generation nothing of serving."""
    broken = broken_nevers(import_graph(), NEVERS)
    assert broken == [], f"imports against the layering: {broken}"


def test_the_network_and_the_public_drafter_sit_where_they_should():
    """The drafter network (`model.modeling_dspark`) reaches no layer above `model`; the public `DSparkDrafter`
    (`hf_dspark.drafter`) imports the loop and interop, not the other way round."""
    graph = import_graph()
    network = reachable(graph, "hf_dspark.model.modeling_dspark")
    assert sorted(m for m in network if m.startswith(("hf_dspark.model.", "hf_dspark.ops.")) or m.count(".") == 1
                  ) == sorted(network)
    assert {"hf_dspark.generation.dispatch", "hf_dspark.interop.loading"} <= graph["hf_dspark.drafter"]
    below = [m for m in graph if package_of(m, LOOP + ABOVE_THE_NETWORK[:1] + (_pkg("model"),)) != m]
    assert [m for m in below if "hf_dspark.drafter" in reachable(graph, m)] == []


def test_no_module_imports_the_package_root():
    importers = sorted(m for m, targets in import_graph().items() if ROOT in targets)
    assert importers == [], f"{importers} import {ROOT} itself; import the module that defines the name instead"


def test_function_local_imports_point_down():
    """A deferred import may keep an import light; it may not reach a layer that loads the importer."""
    graph = import_graph()
    upward = upward_local_imports(graph, local_import_graph(), subpackages(graph))
    assert upward == [], f"upward function-local imports: {upward}"


def test_the_package_root_stays_small():
    root_modules = sorted(path.name for path in (SRC / ROOT).glob("*.py"))
    assert len(root_modules) <= MAX_ROOT_MODULES, f"{len(root_modules)} modules at the package root: {root_modules}"


def test_no_folder_is_too_large():
    sizes = {
        folder.name: sum(len(path.read_text(encoding="utf-8").splitlines()) for path in folder.rglob("*.py"))
        for folder in (SRC / ROOT).iterdir()
        if folder.is_dir()
    }
    large = {name: lines for name, lines in sizes.items() if lines > MAX_FOLDER_LINES}
    assert large == {}, f"folders over {MAX_FOLDER_LINES} lines of Python: {large}; split them by job"


def test_no_module_level_hook_tables():
    """No module-level registry through which a lower layer calls a higher one (`HOOKS`, `CURVE_SOURCES`)."""
    found = []
    for module, (path, _) in _modules().items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            found += [f"{module}.{name}" for name in sorted(names & set(FORBIDDEN_GLOBALS))]
    assert found == [], f"module-level hook tables: {found}; import the layer below, or pass the value in"
