"""The package's layout in numbers: the largest modules, classes and functions, the import circles (imports under
``TYPE_CHECKING`` counted: a circle of type-only imports is still two modules that cannot be read apart), and the
README's length. Issue #39's goals are checked against the numbers (``--check`` exits 1 where one is missed).

    python bench/layout.py            # the report
    python bench/layout.py --check    # and the goals: exit 1 where one is missed

Pure ``ast``: nothing of the package is imported, so it runs on any checkout, broken or not.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "callbridge"

MODULE_MAX_LINES = 700
CLASS_MAX_LINES = 450
FUNCTION_MAX_LINES = 80
CALL_SESSION_MAX_LINES = 400
README_MAX_LINES = 300


@dataclass(frozen=True)
class Sized:
    name: str
    """``module``, ``module:Class`` or ``module:Class.function``."""
    lines: int


@dataclass
class Layout:
    modules: list[Sized]
    classes: list[Sized]
    functions: list[Sized]
    circles: list[list[str]]
    readme_lines: int


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _defs(tree: ast.AST, prefix: str) -> Iterator[tuple[str, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every class and function, nested ones too, with its dotted name."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}.{node.name}" if prefix else node.name
            yield name, node
            yield from _defs(node, name)
        elif not isinstance(node, (ast.expr, ast.stmt)) or isinstance(node, (ast.If, ast.Try, ast.With)):
            yield from _defs(node, prefix)


def _span(node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    assert node.end_lineno is not None
    return node.end_lineno - first + 1


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ``from … import`` names (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(module: str, is_package: bool, tree: ast.AST, known: set[str]) -> set[str]:
    """The package's modules ``module`` imports anywhere in its source (``TYPE_CHECKING`` blocks and function bodies
    too). ``from pkg import name`` is an import of ``pkg.name`` where that is a module, else of ``pkg``."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, is_package, node)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    found.add(sub)
                elif target in known:
                    found.add(target)
    found.discard(module)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative), largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
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
    return sorted(found, key=len, reverse=True)


def measure(root: Path = ROOT) -> Layout:
    files = sorted((root / PACKAGE).rglob("*.py"))
    sources = {path: path.read_text() for path in files}
    names = {path: module_name(path, root) for path in files}
    known = set(names.values())
    modules, classes, functions = [], [], []
    graph: dict[str, set[str]] = {}
    for path, source in sources.items():
        module, tree = names[path], ast.parse(source, str(path))
        modules.append(Sized(module, len(source.splitlines())))
        graph[module] = imports_of(module, path.name == "__init__.py", tree, known)
        for name, node in _defs(tree, ""):
            sized = Sized(f"{module}:{name}", _span(node))
            (classes if isinstance(node, ast.ClassDef) else functions).append(sized)
    by_size = lambda items: sorted(items, key=lambda s: (-s.lines, s.name))  # noqa: E731
    readme = root / "README.md"
    return Layout(
        modules=by_size(modules),
        classes=by_size(classes),
        functions=by_size(functions),
        circles=circles(graph),
        readme_lines=len(readme.read_text().splitlines()) if readme.exists() else 0,
    )


def goals(layout: Layout) -> list[str]:
    """Issue #39's goals that ``layout`` misses, one line each."""
    missed = [f"module over {MODULE_MAX_LINES} lines: {m.name} ({m.lines})" for m in layout.modules if m.lines > MODULE_MAX_LINES]
    missed += [f"class over {CLASS_MAX_LINES} lines: {c.name} ({c.lines})" for c in layout.classes if c.lines > CLASS_MAX_LINES]
    missed += [
        f"function over {FUNCTION_MAX_LINES} lines: {f.name} ({f.lines})"
        for f in layout.functions
        if f.lines > FUNCTION_MAX_LINES
    ]
    session = [c for c in layout.classes if c.name == "callbridge.bridge.call:CallSession"]
    missed += [f"CallSession over {CALL_SESSION_MAX_LINES} lines ({c.lines})" for c in session if c.lines > CALL_SESSION_MAX_LINES]
    missed += [f"import circle of {len(c)} modules: {', '.join(c)}" for c in layout.circles]
    if layout.readme_lines > README_MAX_LINES:
        missed.append(f"README over {README_MAX_LINES} lines ({layout.readme_lines})")
    return missed


def report(layout: Layout, top: int) -> str:
    def table(title: str, rows: list[Sized], limit: int) -> list[str]:
        over = sum(1 for row in rows if row.lines > limit)
        out = [f"## {title} ({len(rows)}; {over} over {limit} lines)", "", "| lines | name |", "|---:|---|"]
        return [*out, *(f"| {row.lines} | `{row.name}` |" for row in rows[:top]), ""]

    in_circles = sorted({m for c in layout.circles for m in c})
    lines = [
        "# callbridge layout",
        "",
        f"- modules: {len(layout.modules)}, {sum(m.lines for m in layout.modules)} lines",
        f"- import circles (type-only imports counted): {len(layout.circles)}, {len(in_circles)} modules in them"
        + (f" (largest: {len(layout.circles[0])})" if layout.circles else ""),
        f"- README.md: {layout.readme_lines} lines",
        "",
        *table("Modules", layout.modules, MODULE_MAX_LINES),
        *table("Classes", layout.classes, CLASS_MAX_LINES),
        *table("Functions", layout.functions, FUNCTION_MAX_LINES),
    ]
    if layout.circles:
        lines += ["## Import circles", ""]
        lines += [f"- {len(c)}: {', '.join(c)}" for c in layout.circles]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top", type=int, default=15, help="rows a table (default 15)")
    parser.add_argument("--check", action="store_true", help="exit 1 where one of issue #39's goals is missed")
    args = parser.parse_args(argv)
    layout = measure()
    print(report(layout, args.top))
    if not args.check:
        return 0
    missed = goals(layout)
    print(f"## Goals: {len(missed)} missed", *(f"- {m}" for m in missed), sep="\n")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
