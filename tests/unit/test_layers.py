"""The layers in README's layout section, enforced: every import in wizard/ and launch/, at module level or
inside a function, points at the module's own layer or one above it (launch: base, probe and the rung table)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Layer:
    name: str
    paths: tuple[str, ...]
    only: frozenset[str] | None          # the layers (or single files) it may import besides itself, when not
                                         # "all above"


def read_layers(readme: str) -> list[Layer]:
    block = re.search(r"<!-- layers -->\s*```\n(.*?)```", readme, re.S)
    assert block, "README.md has no <!-- layers --> block"
    layers = []
    for line in filter(str.strip, block.group(1).splitlines()):
        words, _, only = line.strip().partition("imports:")
        name, *paths = words.split()
        layers.append(Layer(name, tuple(paths), frozenset(only.split()) if only.strip() else None))
    return layers


LAYERS = read_layers((ROOT / "README.md").read_text())


def layer_index(rel: str) -> int | None:
    for i, layer in enumerate(LAYERS):
        if any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in layer.paths):
            return i
    return None


def module_file(module: str, root: Path = ROOT) -> str | None:
    """The repository path of a module of ours (wizard.x.y or launch.x), or None for anyone else's."""
    parts = module.split(".")
    if parts[0] not in ("wizard", "launch"):
        return None
    for k in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:k])
        if base.with_suffix(".py").is_file():
            return str(base.with_suffix(".py").relative_to(root))
        if (base / "__init__.py").is_file():
            return str((base / "__init__.py").relative_to(root))
    return None


def imported_modules(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, module) for every import statement in the file, nested ones included; `from a import b`
    counts as a.b where b is a module, else as a."""
    rel_parts = path.relative_to(root).with_suffix("").parts
    package = rel_parts[:-1]          # a module's package; for __init__.py, the package itself
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for a in node.names:
                sub = f"{module}.{a.name}"
                as_module = module_file(sub, root)
                out.append((node.lineno, sub if as_module and as_module != module_file(module, root) else module))
    return out


def upward_imports(root: Path = ROOT) -> list[str]:
    bad = []
    files = sorted(list((root / "wizard").rglob("*.py")) + list((root / "launch").rglob("*.py")))
    for path in files:
        rel = str(path.relative_to(root))
        mine = layer_index(rel)
        assert mine is not None, f"{rel} is in no layer of README's layout section"
        for line, module in imported_modules(path, root):
            target = module_file(module, root)
            if target is None:
                continue
            theirs = layer_index(target)
            assert theirs is not None, f"{target} is in no layer of README's layout section"
            layer, other = LAYERS[mine], LAYERS[theirs]
            allowed = theirs == mine or ((other.name in layer.only or target in layer.only)
                                         if layer.only is not None else theirs < mine)
            said = f"{rel}:{line} ({layer.name}) imports {module} ({other.name})"
            if not allowed and said not in bad:
                bad.append(said)
    return bad


def test_the_layers_are_the_ones_design_names():
    assert [layer.name for layer in LAYERS] == ["base", "probe", "sizing", "planning", "config", "check",
                                                 "pipeline", "launch", "tune", "frontends"]


def test_no_import_runs_up_the_layers():
    assert upward_imports() == []


def test_an_upward_import_inside_a_function_is_caught(tmp_path):
    """The test sees through function bodies: a planted `from wizard.pipeline import ...` inside a sizing
    function is reported (tests/mutants.py plants the same in the real tree)."""
    import shutil

    shutil.copytree(ROOT / "wizard", tmp_path / "wizard")
    shutil.copytree(ROOT / "launch", tmp_path / "launch")
    target = tmp_path / "wizard" / "sizing" / "memory.py"
    target.write_text(target.read_text() + "\n\ndef _planted():\n    from wizard.pipeline import build\n    return build\n")
    bad = upward_imports(tmp_path)
    assert any("wizard/sizing/memory.py" in b and "wizard.pipeline" in b for b in bad), bad


# --- import cycles among the front ends ---------------------------------------------------------------------------

def runtime_imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """imported_modules without the imports under `if TYPE_CHECKING:` (annotations only, never run)."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {n.lineno for stmt in node.body for n in ast.walk(stmt) if hasattr(n, "lineno")}
    return [(line, module) for line, module in imported_modules(path, root) if line not in typing_only]


def import_cycles(package: str, root: Path = ROOT) -> list[list[str]]:
    """The groups of modules of `package` (a repository path) that import each other round in a circle, at module
    level or inside functions alike (Tarjan's strongly connected components of the import graph, largest first)."""
    files = {str(p.relative_to(root)): p for p in sorted((root / package).rglob("*.py"))}
    graph = {rel: sorted({t for _, m in runtime_imports(p, root) if (t := module_file(m, root)) in files and t != rel})
             for rel, p in files.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return sorted(cycles, key=len, reverse=True)


def test_the_front_ends_import_no_module_that_imports_them_back():
    """A helper two front ends share has one home both import (flags.py, non_interactive.py), never the other
    front end's module: cli.py and compare_cli.py once imported each other's private helpers."""
    assert import_cycles("wizard/frontends") == []


def test_a_planted_import_cycle_among_the_front_ends_is_caught(tmp_path):
    import shutil

    shutil.copytree(ROOT / "wizard", tmp_path / "wizard")
    target = tmp_path / "wizard" / "frontends" / "flags.py"
    target.write_text(target.read_text() + "\n\ndef _planted():\n    from wizard.frontends.cli import main\n"
                      "    return main\n")
    cycles = import_cycles("wizard/frontends", tmp_path)
    assert any({"wizard/frontends/cli.py", "wizard/frontends/flags.py"} <= set(c) for c in cycles), cycles
