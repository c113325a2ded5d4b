"""formtax's import structure: no cycle between modules, and every import goes down the layer order below.

Every import counts: at module level, inside functions (lazy) and under ``TYPE_CHECKING``; a cycle hidden behind a
lazy or type-only import is still a cycle in the design. Registries that name plugins above them (built-in tasks,
the planted backend, the study analyses) name them by module path, resolved on use, like entry points: those are
not imports. The root package ``formtax`` is the facade (its public names are lazy, its own imports type-only) and
holds ``__version__``, which any module may import.
"""

from __future__ import annotations

import ast
import collections
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

# Bottom to top. A module may import its own layer (no cycle, by the check below) and any layer beneath it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("formtax.errors", "formtax.tensorops", "formtax.cache", "formtax._lazy", "formtax.bytetok"),
    ("formtax.constraints",),   # specs, the compile cache, per-request matchers
    ("formtax.decoding",),      # the engine protocol, policies, lowering, the decode loop
    ("formtax.fem",),           # Deco-G's format estimation module (HMM, token DFA, reweighting)
    ("formtax.backends",),      # model engines (hf, fake, vllm, openai)
    ("formtax.strategies",),    # strategies: requests -> policies -> results
    ("formtax.api", "formtax.streaming"),  # the library's entry points
    ("formtax.tasks",),         # benchmark tasks and prompts
    ("formtax.parsing",),       # strict / lenient answer parsers
    ("formtax.scoring",),
    ("formtax.records", "formtax.stats"),
    ("formtax.runner",),        # grids, resumable runs, parallel execution
    ("formtax.report",),        # generic tables, figures, verification
    ("formtax.planted", "formtax.studies"),  # calibration worlds; studies (task + scoring + analyses each)
    ("formtax.integrations", "formtax.serve", "formtax.vllm_plugin"),  # vllm_plugin: vLLM loads it by path
    ("formtax.cli", "formtax.__main__"),
)


def modules(src: Path = SRC, package: str = "formtax") -> dict[str, Path]:
    out = {}
    for path in (src / package).rglob("*.py"):
        parts = path.relative_to(src).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(mods: dict[str, Path], package: str = "formtax") -> dict[str, set[str]]:
    """module -> the package modules it imports (resolved to the deepest module that exists)."""

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = collections.defaultdict(set)
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up) + ("." + base if base else "")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                if t == package or t.startswith(package + "."):
                    hit = resolve(t)
                    if hit is not None and hit != name:
                        graph[name].add(hit)
    return graph


def cycles(graph: dict[str, set[str]], skip: frozenset[str] = frozenset()) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    nodes = sorted(set(graph) | {t for ts in graph.values() for t in ts})
    counter = 0

    def succ(v: str) -> list[str]:
        return sorted(t for t in graph.get(v, ()) if t not in skip)

    for root in nodes:
        if root in index or root in skip:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(succ(root)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(succ(w))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for k, layer in enumerate(LAYERS):
        for prefix in layer:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), k)
    return None if best is None else best[1]


def upward(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for a in sorted(graph):
        if a == "formtax":
            continue
        for b in sorted(graph[a]):
            if b == "formtax":
                continue  # __version__
            la, lb = layer_of(a), layer_of(b)
            if la is not None and lb is not None and lb > la:
                bad.append(f"{a} (layer {la}: {LAYERS[la][0]}) imports {b} (layer {lb}: {LAYERS[lb][0]})")
    return bad


GRAPH = imports(modules())


def test_every_module_has_a_layer() -> None:
    missing = sorted(m for m in modules() if m != "formtax" and layer_of(m) is None)
    assert not missing, f"place these modules in LAYERS: {missing}"


def test_no_import_cycle() -> None:
    assert cycles(GRAPH, skip=frozenset({"formtax"})) == []


def test_imports_only_go_down_the_layers() -> None:
    assert upward(GRAPH) == []


def test_no_backend_imports_a_strategy() -> None:
    bad = sorted((a, b) for a, bs in GRAPH.items() if a.startswith("formtax.backends")
                 for b in bs if b.startswith("formtax.strategies"))
    assert bad == []


@pytest.mark.parametrize("how", ["top", "lazy", "type-only"])
def test_the_checks_catch_a_cycle_and_an_upward_import(tmp_path: Path, how: str) -> None:
    """The checker itself: a cycle made through a module-level, a function-level or a TYPE_CHECKING import."""
    pkg = tmp_path / "formtax"
    (pkg / "decoding").mkdir(parents=True)
    (pkg / "strategies").mkdir()
    for p in (pkg, pkg / "decoding", pkg / "strategies"):
        (p / "__init__.py").write_text("")
    back = {"top": "from formtax.strategies.base import S\n",
            "lazy": "def f():\n    from formtax.strategies import base\n",
            "type-only": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from formtax.strategies.base import S\n"}
    (pkg / "decoding" / "loop.py").write_text(back[how])
    (pkg / "strategies" / "base.py").write_text("from ..decoding.loop import f\nS = 1\n")
    graph = imports(modules(tmp_path))
    assert cycles(graph) == [["formtax.decoding.loop", "formtax.strategies.base"]]
    assert upward(graph) == ["formtax.decoding.loop (layer 2: formtax.decoding) imports formtax.strategies.base "
                             "(layer 5: formtax.strategies)"]
