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


def _is_type_checking(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`): imports for the type checker, never run."""
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(tree: ast.AST, runtime_only: bool):
    """ast.walk, leaving out the bodies of `if TYPE_CHECKING:` when `runtime_only`."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if runtime_only and _is_type_checking(node):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def imported_modules(path: Path, root: Path = ROOT, runtime_only: bool = False) -> list[tuple[int, str]]:
    """(line, module) for every import statement in the file, nested ones included (`runtime_only`: not
    those under `if TYPE_CHECKING:`); `from a import b` counts as a.b where b is a module, else as a."""
    rel_parts = path.relative_to(root).with_suffix("").parts
    package = rel_parts[:-1]          # a module's package; for __init__.py, the package itself
    out = []
    for node in _walk(ast.parse(path.read_text(), str(path)), runtime_only):
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


# ----------------------------------------------------------------------------- import cycles

# Cycles another change removes: each entry names its modules and who fixes it, and is deleted with the fix.
KNOWN_CYCLES: set[frozenset[str]] = set()


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Our module files -> the module files they import at run time (in functions too; not for the type
    checker)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(list((root / "wizard").rglob("*.py")) + list((root / "launch").rglob("*.py"))):
        rel = str(path.relative_to(root))
        targets = (module_file(module, root) for _, module in imported_modules(path, root, runtime_only=True))
        graph[rel] = {t for t in targets if t is not None and t != rel}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[frozenset[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
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
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(frozenset(component))
    return cycles


def test_no_import_cycle_among_our_modules():
    """Two modules that import each other (even inside functions) share something that belongs in a third both
    import (README, "Development": shared helpers get one public home)."""
    cycles = import_cycles(import_graph())
    unexpected = [sorted(c) for c in cycles if c not in KNOWN_CYCLES]
    assert not unexpected, f"import cycles: {unexpected}"


def test_a_planted_import_cycle_is_caught(tmp_path):
    import shutil

    shutil.copytree(ROOT / "wizard", tmp_path / "wizard")
    shutil.copytree(ROOT / "launch", tmp_path / "launch")
    target = tmp_path / "wizard" / "errors.py"
    target.write_text(target.read_text() + "\n\ndef _planted():\n    from wizard.units import parse_count\n"
                      "    return parse_count\n")
    assert "from wizard.errors import" in (tmp_path / "wizard" / "units.py").read_text()   # the plant closes a circle
    assert frozenset({"wizard/units.py", "wizard/errors.py"}) in import_cycles(import_graph(tmp_path))


def test_an_import_for_the_type_checker_alone_is_no_cycle():
    graph = import_graph()
    assert "wizard/frontends/tui/app.py" not in graph["wizard/frontends/tui/screens/base.py"]
