"""House rules of the library code (issue 38), checked on the source so they stay true:
no module imports another module's private names (a split that needs one is the wrong cut),
no two modules import each other (directly or in a longer circle), and tensordict's
internals are touched in one module only (``tdrl.core.td_access``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_INTERNALS = re.compile(r"\b(_tensordict|_new_unsafe|_set_str|_get_str|_set_tuple|_td_dim_names)\b")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / "packages").glob("*/src/tdrl/**/*.py")):
        parts = list(path.relative_to(path.parents[len(path.relative_to(ROOT).parts) - 4]).with_suffix("").parts)
        parts = parts[parts.index("tdrl"):]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]):
    """``(target module, imported name)`` of every ``from ... import`` of a tdrl module."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        if target.startswith("tdrl"):
            for alias in node.names:
                yield target, alias.name


def test_no_module_imports_another_modules_private_names():
    modules = _modules()
    found = [f"{name} imports {target}.{imported}" for name, path in modules.items()
             for target, imported in _imports(name, path, modules)
             if imported.startswith("_") and not imported.startswith("__") and f"{target}.{imported}" not in modules
             and target != name]
    assert not found, "make the shared piece public (or give it its own module):\n" + "\n".join(found)


def test_no_import_cycles_between_modules():
    modules = _modules()
    packages = {n for n, p in modules.items() if p.name == "__init__.py"}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        if name in packages:
            continue
        for target, imported in _imports(name, path, modules):
            dest = f"{target}.{imported}" if f"{target}.{imported}" in modules else target
            if dest in modules and dest != name and dest not in packages:
                graph.setdefault(name, set()).add(dest)
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "modules that import each other (give the shared piece its own module):\n" + "\n".join(
        " -> ".join(c) for c in cycles)


def test_tensordict_internals_live_in_one_module():
    home = ROOT / "packages/core/src/tdrl/core/td_access.py"
    users = [str(p.relative_to(ROOT)) for p in (ROOT / "packages").glob("*/src/tdrl/**/*.py")
             if p != home and _INTERNALS.search(re.sub(r"#.*", "", p.read_text()))]
    assert not users, "use tdrl.core.td_access instead of tensordict internals in: " + ", ".join(users)
    assert _INTERNALS.search(home.read_text())


def test_benchmarks_are_a_package_that_never_edits_sys_path():
    """``python -m benchmarks.<name>`` from the root: a benchmark imports its neighbours as
    ``benchmarks.<module>`` (the shared helpers are ``benchmarks.records``) and never edits
    ``sys.path`` or imports a neighbour's private names."""
    bench = ROOT / "benchmarks"
    assert (bench / "__init__.py").is_file()
    scripts = sorted(bench.glob("*.py"))
    assert len(scripts) > 20
    edits, private, bare = [], [], []
    neighbours = {p.stem for p in scripts}
    for path in scripts:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                    and node.value.id == "sys"):
                edits.append(path.name)
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                if node.module.startswith("benchmarks."):
                    private += [f"{path.name}: {a.name}" for a in node.names if a.name.startswith("_")]
                elif node.module in neighbours:
                    bare.append(f"{path.name}: from {node.module}")
            if isinstance(node, ast.Import):
                bare += [f"{path.name}: import {a.name}" for a in node.names if a.name in neighbours]
    assert not edits, f"sys.path used in {sorted(set(edits))}: import benchmarks.<module> instead"
    assert not private, f"private names imported between benchmarks: {private}"
    assert not bare, f"neighbours imported by bare name (works only as a script): {bare}"
