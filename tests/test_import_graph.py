"""The import graph of `specdec` has no cycles (issue 25: a house that shows its architecture).

The walker reads every module under `src/specdec` with `ast` (nothing is imported) and
draws an edge A -> B when A's top level imports module B:

- only statements that run at import time count: a module's body, including the bodies of
  `if` / `try` / `with` / `for` / `while` and of classes, but not of functions (an import in
  a function runs when the function is called) nor of an `if TYPE_CHECKING:` block (its
  `else:` counts);
- relative imports are resolved to absolute names (`from .x import y` in `specdec.a.b` is
  `specdec.a.x`); a package's `__init__.py` is the module `specdec.pkg`;
- `from pkg import name` is an import of the submodule `pkg.name` when that is a module, and
  of `pkg` otherwise; `import a.b.c` is an import of `a.b.c`;
- the parent packages that Python executes first (importing `specdec.a.b` runs
  `specdec/a/__init__.py`) are not edges: a package's `__init__` that re-exports its children
  is not a cycle with them, since Python finishes `pkg.child` before it returns to
  `pkg/__init__`. Only a module that asks the package itself for a name (`from specdec
  import X` where X is not a submodule) depends on that `__init__`.

A cycle is reported as `a -> b -> a`, each edge with the file and line of its import.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "specdec"


def module_files(root: Path) -> dict[str, Path]:
    """Module name -> file, for every `.py` under the package directory `root`."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = (root.name, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_statements(body: list[ast.stmt]):
    """Every import statement of `body` that runs when the module is imported."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue  # runs when called, not at import time
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _import_time_statements(node.body)
            yield from _import_time_statements(node.orelse)
        else:  # class bodies, try / with / for / while / match blocks run at import time
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(node, field, None) or []:
                    clause = isinstance(child, (ast.excepthandler, ast.match_case))  # except / case: a body of its own
                    yield from _import_time_statements(child.body if clause else [child])


def _internal(name: str, modules: dict[str, Path]) -> str | None:
    """`name`, or its longest prefix that is one of `modules` (`import a.b.c` of a missing c)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def import_edges(root: Path) -> dict[str, dict[str, int]]:
    """module -> {imported module: line of the first import of it}, modules under `root` only."""
    modules = module_files(root)
    edges: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        package = module if is_package else module.rpartition(".")[0]
        out = edges.setdefault(module, {})
        for node in _import_time_statements(ast.parse(path.read_text(), filename=str(path)).body):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base_parts = package.split(".")
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    targets.append(submodule if submodule in modules else base)
            for target in targets:
                internal = _internal(target, modules)
                if internal is not None and internal != module:
                    out.setdefault(internal, node.lineno)
    return edges


def _strongly_connected(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's components of more than one module, each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(components)


def _shortest_cycle(start: str, members: set[str], edges: dict[str, dict[str, int]]) -> list[str]:
    """The shortest path start -> ... -> start inside one component (breadth first)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(edges[v]):
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if w not in previous:
                    previous[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"{start} is in a component but on no cycle")


def import_cycles(root: Path) -> list[list[str]]:
    """One cycle per strongly connected component of the import graph of `root`, e.g.
    `["specdec.a", "specdec.b", "specdec.a"]`; every module of a component is on some cycle,
    and a component of several cycles reports the shortest one through each of its modules."""
    edges = import_edges(root)
    cycles = []
    for component in _strongly_connected(edges):
        members = set(component)
        seen: list[list[str]] = []
        for module in component:
            if any(module in cycle for cycle in seen):
                continue
            seen.append(_shortest_cycle(module, members, edges))
        cycles += seen
    return cycles


def describe(cycle: list[str], root: Path) -> str:
    """`a -> b -> a`, then one line per edge: the file and line of the import."""
    edges = import_edges(root)
    files = module_files(root)
    lines = [" -> ".join(cycle)]
    for a, b in zip(cycle, cycle[1:]):
        path = files[a].relative_to(root.parent)
        lines.append(f"    {path}:{edges[a][b]}: {a} imports {b}")
    return "\n".join(lines)


def test_specdec_has_no_import_cycles():
    cycles = import_cycles(SRC)
    assert len(module_files(SRC)) > 50  # the walker saw the package
    assert "specdec.hookspecs" in import_edges(SRC)["specdec.registry"]  # and its edges
    assert not cycles, f"{len(cycles)} import cycle(s) in specdec:\n" + "\n".join(describe(c, SRC) for c in cycles)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_walker_reports_a_planted_cycle(tmp_path):
    root = tmp_path / "pkg"
    _write(
        root,
        {
            "__init__.py": "from .a import A\nfrom . import sub\n",  # re-exports: not a cycle
            "a.py": "from .b import B\nA = 1\n",
            "b.py": "from __future__ import annotations\nimport pkg.a\nB = 2\n",
            "sub/__init__.py": "from .c import C\n",
            "sub/c.py": "from .. import a\nfrom ..b import B\nC = 3\n",
        },
    )
    cycles = import_cycles(root)
    assert cycles == [["pkg.a", "pkg.b", "pkg.a"]]
    assert describe(cycles[0], root).splitlines() == [
        "pkg.a -> pkg.b -> pkg.a",
        "    pkg/a.py:1: pkg.a imports pkg.b",
        "    pkg/b.py:2: pkg.b imports pkg.a",
    ]


def test_walker_ignores_what_does_not_run_at_import_time(tmp_path):
    root = tmp_path / "pkg"
    _write(
        root,
        {
            "__init__.py": "",
            "a.py": """
                from typing import TYPE_CHECKING
                import pkg.b
                if TYPE_CHECKING:
                    from .c import C
                """,
            "b.py": """
                import typing
                if typing.TYPE_CHECKING:
                    from . import a
                def f():
                    from .a import x
                    return x
                """,
            "c.py": """
                try:
                    from .d import D
                except ImportError:
                    D = None
                class K:
                    from . import a
                """,
            "d.py": "",
        },
    )
    assert import_edges(root) == {"pkg": {}, "pkg.a": {"pkg.b": 3}, "pkg.b": {}, "pkg.c": {"pkg.d": 3, "pkg.a": 7}, "pkg.d": {}}
    assert import_cycles(root) == []
    # the class body runs at import time: a -> c would close a cycle through it
    (root / "a.py").write_text("from .c import C\n")
    assert import_cycles(root) == [["pkg.a", "pkg.c", "pkg.a"]]
