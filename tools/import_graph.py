"""Print the figures of roll_ma's import graph: modules, edges, and the cycles in it.

Run from the repository root: ``python tools/import_graph.py``. The figures are the ones the
layering issue (#39) quotes before and after; ``lint-imports`` is what enforces the layers.

- modules: every module of the package (``__init__`` counts as the package's module);
- edges: direct imports between two roll_ma modules (lazy imports inside functions included);
- package edges: distinct (a, b) pairs where a module of top-level part ``a`` imports one of ``b``
  (a top-level part is a subpackage such as ``config`` or a top module such as ``cli``);
- package cycles: pairs of top-level parts that import each other, directly or through others;
- module cycles: strongly connected groups of modules (size > 1).
"""

from __future__ import annotations

import sys
from collections import defaultdict

import grimp

PACKAGE = "roll_ma"


def top_part(module: str) -> str:
    """``roll_ma.config.schema`` -> ``config``; ``roll_ma`` itself -> ``roll_ma``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def strongly_connected(nodes: set[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; returns the groups with more than one member."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    counter = 0
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def main() -> int:
    graph = grimp.build_graph(PACKAGE, include_external_packages=False, cache_dir=None)
    modules = {m for m in graph.modules if m == PACKAGE or m.startswith(PACKAGE + ".")}
    edges: dict[str, set[str]] = defaultdict(set)
    for importer in modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            if imported in modules and imported != importer:
                edges[importer].add(imported)
    n_edges = sum(len(v) for v in edges.values())

    part_edges: dict[str, set[str]] = defaultdict(set)
    arrows: dict[tuple[str, str], list[str]] = defaultdict(list)
    for importer, targets in edges.items():
        for imported in targets:
            a, b = top_part(importer), top_part(imported)
            if a != b and PACKAGE not in (a, b):
                part_edges[a].add(b)
                arrows[(a, b)].append(f"{importer} -> {imported}")
    parts = {top_part(m) for m in modules} - {PACKAGE}
    part_groups = strongly_connected(parts, part_edges)
    mutual = sorted((a, b) for a in part_edges for b in part_edges[a] if a < b and a in part_edges.get(b, ()))
    module_groups = strongly_connected(modules, edges)

    print(f"modules: {len(modules)}")
    print(f"import edges (module -> module): {n_edges}")
    print(f"package edges (top-level part -> part): {sum(len(v) for v in part_edges.values())}")
    print(f"package cycles (strongly connected groups of top-level parts): {len(part_groups)}")
    for group in part_groups:
        print(f"  {' <-> '.join(group)}")
    print(f"package pairs importing each other: {len(mutual)}")
    for a, b in mutual:
        print(f"  {a} <-> {b}")
        for arrow in sorted(arrows[(a, b)] + arrows[(b, a)]):
            print(f"      {arrow}")
    print(f"module cycles: {len(module_groups)}")
    for group in module_groups:
        print(f"  {len(group)} modules: {', '.join(group)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
