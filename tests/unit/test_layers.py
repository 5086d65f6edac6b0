"""The package's floor plan: no import cycles between modules, and every import points down or sideways.

Every module under ``unison/`` is parsed with `ast`; every import counts, the ones inside functions
(lazy imports) included, since a lazy import is still a dependency that runs. ``from . import x`` and
``from .pkg import name`` resolve to the submodule when ``name`` is one. Imports under
``if TYPE_CHECKING:`` are left out: they never run, and annotations may name a type from any floor.

The floors, bottom first, are `FLOORS` here and the "Floor plan" section of docs/architecture.md. A
unit is a subpackage of ``unison`` (``unison.engine``) or a module directly in it (``unison._job.runtime``);
a unit may import units on its own floor or below, never above.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGE = ROOT / "unison"

# Bottom floor first. Keep in step with the "Floor plan" section of docs/architecture.md.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("unison._contract", "unison._version", "unison.config", "unison.dtypes",
                    "unison.errors", "unison.ops", "unison.process_sets")),
    ("protocol", ("unison.protocol",)),
    ("rpc", ("unison.rpc",)),
    ("transports", ("unison.backends", "unison.service")),
    ("engine", ("unison.engine",)),
    ("gpu", ("unison.gpu",)),
    ("job", ("unison._job", "unison.compression")),
    ("elastic", ("unison.elastic",)),
    ("parameter servers", ("unison.ps",)),
    ("adapters", ("unison.adapters",)),
    ("launcher", ("unison.launcher", "unison.status")),
    ("public", ("unison", "unison.common", "unison.keras", "unison.ps.keras", "unison.ps.torch", "unison.ray",
                "unison.runner", "unison.tensorflow", "unison.testing", "unison.torch")),
)

_PLACED = frozenset(unit for _, units in FLOORS for unit in units)

# Upward edges still in the tree, each with the reason it stays: (importer, imported module).
KNOWN_UPWARD: frozenset[tuple[str, str]] = frozenset()

# Import cycles still in the tree: the modules of each.
KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()


@dataclass(frozen=True)
class Edge:
    """One import statement: `source` imports `target` at `path`:`line`."""

    source: str
    target: str
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.source} imports {self.target}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _existing(name: str, modules: dict[str, Path]) -> str:
    """The longest prefix of the dotted `name` that is a module (``unison.x.Name`` -> ``unison.x``)."""
    while name not in modules:
        name = name.rpartition(".")[0]
    return name


def _imports(module: str, modules: dict[str, Path]) -> list[Edge]:
    path = modules[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    shown = str(path.relative_to(ROOT))
    edges: list[Edge] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit_node(other)
                continue
            visit_node(child)

    def visit_node(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "unison" or alias.name.startswith("unison."):
                    edges.append(Edge(module, _existing(alias.name, modules), shown, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                full = ".".join(base + ([node.module] if node.module else []))
            else:
                full = node.module or ""
            if full == "unison" or full.startswith("unison."):
                for alias in node.names:
                    sub = f"{full}.{alias.name}"
                    target = sub if sub in modules else _existing(full, modules)
                    edges.append(Edge(module, target, shown, node.lineno))
        visit(node)

    visit(ast.parse(path.read_text(), filename=shown))
    return [edge for edge in edges if edge.target != module]


def _unresolved(modules: dict[str, Path]) -> list[str]:
    """Imports of unison modules that do not exist (a lazy one fails only when its function runs)."""
    missing: list[str] = []
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    names = [".".join(base + ([node.module] if node.module else []))]
                else:
                    names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            missing += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in names
                        if (name == "unison" or name.startswith("unison.")) and name not in modules]
    return missing


def test_every_import_of_unison_names_a_module_that_exists() -> None:
    assert _unresolved(_modules()) == []


def _graph() -> tuple[dict[str, Path], list[Edge]]:
    modules = _modules()
    return modules, [edge for module in modules for edge in _imports(module, modules)]


def _unit(module: str) -> str:
    """The unit a module belongs to: the longest one placed in `FLOORS` that contains it (a public module
    inside a lower package, as ``unison.ps.torch``), else its package below ``unison``."""
    parts = module.split(".")
    for depth in range(len(parts), 2, -1):
        if ".".join(parts[:depth]) in _PLACED:
            return ".".join(parts[:depth])
    return ".".join(parts[:2])


def _floor_of() -> dict[str, int]:
    return {unit: index for index, (_, units) in enumerate(FLOORS) for unit in units}


def _cycles(modules: dict[str, Path], edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    successors: dict[str, list[str]] = defaultdict(list)
    for edge in edges:
        successors[edge.source].append(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in modules:
        if start in index:
            continue
        work = [(start, iter(successors[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(successors[child])))
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
                    found.append(sorted(component))
    return found


def test_every_unit_is_on_one_floor() -> None:
    modules, _ = _graph()
    placed = [unit for _, units in FLOORS for unit in units]
    assert len(placed) == len(set(placed)), "a unit is on two floors"
    missing = sorted({_unit(module) for module in modules} - set(placed))
    assert not missing, f"put these on a floor in FLOORS (and docs/architecture.md): {missing}"
    stale = sorted(set(placed) - {_unit(module) for module in modules})
    assert not stale, f"these units in FLOORS no longer exist: {stale}"


def test_no_import_cycles_between_modules() -> None:
    modules, edges = _graph()
    found = _cycles(modules, edges)
    cycles = [component for component in found if frozenset(component) not in KNOWN_CYCLES]
    lines = []
    for component in cycles:
        members = set(component)
        lines.append(" <-> ".join(component))
        lines += [f"    {edge}" for edge in edges if edge.source in members and edge.target in members]
    assert not cycles, "import cycles between modules (break each by moving the shared part down):\n" + \
        "\n".join(lines)
    stale = KNOWN_CYCLES - {frozenset(component) for component in found}
    assert not stale, f"KNOWN_CYCLES lists cycles that are gone; remove them: {sorted(map(sorted, stale))}"


def test_every_import_points_down_the_floor_plan() -> None:
    _, edges = _graph()
    floor = _floor_of()
    names = [name for name, _ in FLOORS]
    upward = [edge for edge in edges if floor[_unit(edge.target)] > floor[_unit(edge.source)]]
    unexplained = [edge for edge in upward if (edge.source, edge.target) not in KNOWN_UPWARD]
    lines = [f"{edge}  ({names[floor[_unit(edge.source)]]} -> {names[floor[_unit(edge.target)]]})"
             for edge in unexplained]
    assert not unexplained, "imports that point up the floor plan (FLOORS, bottom first: " + \
        " < ".join(names) + "):\n" + "\n".join(lines)
    stale = KNOWN_UPWARD - {(edge.source, edge.target) for edge in upward}
    assert not stale, f"KNOWN_UPWARD lists edges that are gone; remove them: {sorted(stale)}"


def test_the_floor_plan_is_the_documented_one() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Floor plan", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    documented = [(row.split("|")[1].strip(), tuple(sorted(
        unit.strip(" `") for unit in row.split("|")[2].split(",")))) for row in rows]
    assert documented == [(name, tuple(sorted(units))) for name, units in FLOORS]


def test_import_unison_leaves_the_launcher_unloaded() -> None:
    # A training process imports unison; the launcher's modules are unisonrun's, loaded by unison.run.
    code = ("import sys, unison; loaded = sorted(m for m in sys.modules if m.startswith('unison.launcher'));"
            " print(','.join(loaded)); assert callable(unison.run)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=ROOT, check=True)
    assert result.stdout.strip() == "", f"import unison loaded {result.stdout.strip()}"


def test_the_contract_imports_nothing_of_unison() -> None:
    # The keeper runs as ``python -I -S launcher/supervision/keeper.py``, outside the package, and loads
    # the contract by its path.
    _, edges = _graph()
    assert [str(edge) for edge in edges if edge.source == "unison._contract"] == []


def test_the_launcher_imports_only_what_the_elastic_package_shares() -> None:
    # The driver decides with elastic.membership and --status reads elastic.store; the rest is the ranks'.
    _, edges = _graph()
    reaches = sorted(str(edge) for edge in edges if edge.source.startswith("unison.launcher.")
                     and edge.target.startswith("unison.elastic._"))
    assert reaches == []


# Modules that still read the engine's process-set table themselves instead of asking the job.
KNOWN_SET_TABLE_READERS: frozenset[str] = frozenset()


def test_the_job_owns_process_set_membership() -> None:
    # The engine keeps the table; everything else asks the job (Job.set_members, Job.registered_sets).
    readers = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        shown = str(path.relative_to(ROOT))
        if shown.startswith("unison/engine/") or shown == "unison/_job/runtime.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=shown)):
            if (isinstance(node, ast.Attribute) and node.attr == "process_sets"
                    and isinstance(node.value, ast.Attribute) and node.value.attr == "engine"):
                readers.add(shown)
    assert readers - KNOWN_SET_TABLE_READERS == set(), "ask the job (Job.set_members) instead"
    assert KNOWN_SET_TABLE_READERS - readers == set(), "remove these from KNOWN_SET_TABLE_READERS"
