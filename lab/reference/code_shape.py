"""Counts of src/ddpbench's shape, read with ``ast`` (nothing is imported): its modules, the import
edges between them (module -> each package module it imports anywhere in its file, the parents a
submodule passes through left out), whether those edges form a cycle, and for the named files the
longest function or method and the length of named definitions.

    python lab/reference/code_shape.py [FILE[:NAME] ...]

FILE is a path under src/ddpbench; NAME a class, function or Class.method in it (its line count,
decorators and docstring included)."""

from __future__ import annotations

import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "ddpbench"


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ["ddpbench", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def edges(mods: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    graph = {}
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".")[:len(name.split(".")) - node.level + (1 if is_package else 0)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in mods else target)
        graph[name] = {m for m in found if m in mods and m != name and m not in parents}
    return graph


def has_cycle(graph: dict[str, set[str]]) -> bool:
    state: dict[str, int] = {}

    def visit(node: str) -> bool:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1 or (nxt not in state and visit(nxt)):
                return True
        state[node] = 2
        return False

    sys.setrecursionlimit(10_000)
    return any(visit(node) for node in sorted(graph) if node not in state)


def definitions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function and class, methods as Class.method."""
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield prefix + node.name, node
            if isinstance(node, ast.ClassDef):
                yield from definitions(node, f"{prefix}{node.name}.")


def length(node: ast.AST) -> int:
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return node.end_lineno - first + 1


def main(argv: list[str]) -> None:
    mods = modules()
    graph = edges(mods)
    print(f"modules {len(mods)}, import edges {sum(map(len, graph.values()))}, "
          f"cycle {'yes' if has_cycle(graph) else 'none'}")
    for arg in argv:
        file, _, name = arg.partition(":")
        tree = ast.parse((PACKAGE / file).read_text())
        defs = dict(definitions(tree))
        if name:
            print(f"{file}:{name} {length(defs[name]) if name in defs else 'absent'} lines")
            continue
        functions = [(length(n), q) for q, n in defs.items() if not isinstance(n, ast.ClassDef)]
        longest = max(functions, default=(0, "-"))
        print(f"{file}: {len((PACKAGE / file).read_text().splitlines())} lines, longest function "
              f"{longest[1]} {longest[0]} lines")


if __name__ == "__main__":
    main(sys.argv[1:])
