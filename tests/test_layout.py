"""The package layout is part of the design: wings import only the wings their docstring allows, and no module
imports itself back through others (no import circle). Both are read from the source with `ast`, not guessed.

Each wing's `__init__.py` docstring ends with `May import: a, b, c.`; that line is the rule checked here, so the
documentation and the code cannot drift apart.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pipeline"
WINGS = ("core", "vision", "capture", "modelprep", "inference", "behavior", "outputs", "config", "service", "tools")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def import_graph() -> dict[str, set[str]]:
    """module -> the pipeline modules it imports (at any depth: top level, in functions, under TYPE_CHECKING)."""
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def wing_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in WINGS else None


def allowed_imports(wing: str) -> set[str]:
    """The wings named on the `May import:` line of the wing's docstring (`nothing` = none)."""
    doc = ast.get_docstring(ast.parse((PACKAGE / wing / "__init__.py").read_text(encoding="utf-8"))) or ""
    match = re.search(r"May import:\s*([^.]*)\.", doc)
    if match is None:
        raise AssertionError(f"pipeline/{wing}/__init__.py: the docstring has no 'May import: ...' line")
    text = match.group(1)
    if "every other wing" in text:
        return set(WINGS)
    return {w for w in re.findall(r"[a-z]+", text) if w in WINGS}


def test_no_import_circle() -> None:
    assert cycles(import_graph()) == []


def test_every_module_is_in_a_wing_with_a_docstring() -> None:
    outside = [m for m in _modules() if m != "pipeline" and wing_of(m) is None]
    assert outside == [], f"modules outside every wing: {outside}"
    for wing in WINGS:
        doc = ast.get_docstring(ast.parse((PACKAGE / wing / "__init__.py").read_text(encoding="utf-8"))) or ""
        assert "Owns:" in doc and "May import:" in doc, f"pipeline/{wing}/__init__.py must say what it owns and imports"


@pytest.mark.parametrize("wing", WINGS)
def test_wing_imports_only_what_its_docstring_allows(wing: str) -> None:
    allowed = allowed_imports(wing) | {wing}
    wrong = sorted(f"{source} -> {target}" for source, targets in import_graph().items() if wing_of(source) == wing
                   for target in targets if wing_of(target) is not None and wing_of(target) not in allowed)
    assert wrong == [], f"pipeline/{wing} may import {sorted(allowed)} only"


def test_the_checks_catch_a_circle_and_a_forbidden_import() -> None:
    """The checks above must be able to fail: a made-up graph with a circle and an upward import."""
    graph = {"pipeline.vision.a": {"pipeline.service.b"}, "pipeline.service.b": {"pipeline.vision.a"}}
    assert cycles(graph) == [["pipeline.service.b", "pipeline.vision.a"]]
    assert "service" not in allowed_imports("vision")
