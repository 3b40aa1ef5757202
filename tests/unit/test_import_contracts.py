"""The packages' import contracts (pyproject.toml, [tool.importlinter]), checked by import-linter's own
command: the engine imports neither the edge nor the service, nor any HTTP, SQL or server library; the
edge does not import the service; inside the service the API sits on dispatch, and dispatch on
persistence, never the other way (docs/architecture.md). And no import cycles: none among the
packages' modules (counting deferred imports), none among the scripts."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_every_import_contract_is_kept() -> None:
    command = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert command, "import-linter is a dev dependency: lint-imports must be installed"
    result = subprocess.run([command, "--no-cache"], check=False, cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "Contracts: 4 kept, 0 broken." in result.stdout


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph` (module -> modules it imports): its strongly connected components
    of more than one module, and any module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.get(module, ()):
            if imported not in graph:
                continue
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1 or module in graph[module]:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_the_packages_is_part_of_an_import_cycle() -> None:
    """Every import counts, a deferred one inside a function too: a cycle broken only by import order
    is still one."""
    import grimp

    graph = grimp.build_graph("engine", "edge", "service")
    modules = {module: set(graph.find_modules_directly_imported_by(module)) for module in graph.modules}
    assert _cycles(modules) == []


def _imported_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_the_scripts_import_no_cycle() -> None:
    """scripts/ is a folder of programs that import each other's helpers by module name (the fixture
    builders share fixture_tools.py, the Go builds go_build.py); no two of them may import each other,
    however deep the import."""
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")}  # `import fuzz` is the package
    scripts = {path.stem: path for path in (ROOT / "scripts").glob("*.py")}
    graph = {name: (_imported_names(path) - packages) & scripts.keys() for name, path in scripts.items()}
    assert "fixture_tools" in graph["build_fixtures"]
    assert _cycles(graph) == []
