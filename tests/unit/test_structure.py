"""The tree's own rules (docs/architecture.md): small modules, package faces that only
re-export, no import cycle in ``service/``, and every integration module saying how
long it takes."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parents[2] / "service"
MODULES = sorted(SERVICE.rglob("*.py"))
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(SERVICE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


NAMES = {module_name(p): p for p in MODULES}


def imports(path: Path) -> set[str]:
    """The service modules ``path`` imports at module level (TYPE_CHECKING included);
    ``from package import module`` names the module, not the package's face."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    nodes = [n for n in tree.body if not isinstance(n, ast.If)]
    nodes += [n for block in tree.body if isinstance(block, ast.If) for n in block.body]
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in NAMES}
        elif isinstance(node, ast.ImportFrom) and node.module in NAMES:
            subs = {f"{node.module}.{a.name}" for a in node.names}
            found |= subs & NAMES.keys()
            if subs - NAMES.keys():
                found.add(node.module)
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SERVICE)))
def test_no_module_is_longer_than_400_lines(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= MAX_LINES


@pytest.mark.parametrize("path", [p for p in MODULES if p.name == "__init__.py"],
                         ids=lambda p: str(p.relative_to(SERVICE)))
def test_a_package_face_only_re_exports(path: Path) -> None:
    for node in ast.parse(path.read_text()).body:
        allowed = isinstance(node, ast.Import | ast.ImportFrom) or (
            isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)) or (
            isinstance(node, ast.Assign) and [t.id for t in node.targets
                                              if isinstance(t, ast.Name)] == ["__all__"])
        assert allowed, f"{path}: line {node.lineno} defines something"


def test_no_import_cycle_in_service() -> None:
    graph = {name: imports(path) for name, path in NAMES.items()}
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            cycle = [*trail[trail.index(name):], name]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        for imported in sorted(graph[name]):
            visit(imported, [*trail, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


INTEGRATION = sorted((SERVICE.parent / "tests" / "integration").glob("test_*.py"))


@pytest.mark.parametrize("path", INTEGRATION, ids=lambda p: p.name)
def test_each_integration_module_says_how_long_it_takes(path: Path) -> None:
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert docstring.splitlines()[-1].startswith("Takes ≈ "), \
        f"{path.name}: end the docstring with 'Takes ≈ N s (...)' (make test prints the seconds)"


def test_the_pure_state_machine_imports_no_kafka_client() -> None:
    # The stage's face re-exported Stage: importing service.stage.machine loaded
    # confluent_kafka and 51 modules of the package.
    code = ("import sys, service.stage.machine; "
            "print('confluent_kafka' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=SERVICE.parent).stdout
    assert out.strip() == "False"


BENCH = sorted((SERVICE.parent / "bench").rglob("*.py"))


@pytest.mark.parametrize("path", BENCH, ids=lambda p: p.name)
def test_bench_imports_nothing_of_the_tests(path: Path) -> None:
    # bench/ ships in the wheel, tests/ does not: an import of tests breaks an installed
    # bench at its first line. Imports inside functions count too.
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    of_tests = sorted(name for name in imported if name.split(".")[0] == "tests")
    assert not of_tests, f"bench/{path.name} imports {', '.join(of_tests)}"
