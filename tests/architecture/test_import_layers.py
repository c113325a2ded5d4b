"""formtax's import structure: no cycle between modules, every import goes down the layer order below, and no
module reaches another layer by naming it in a string.

Every import counts: at module level, inside functions (lazy) and under ``TYPE_CHECKING``; a cycle hidden behind a
lazy or type-only import is still a cycle in the design. So does every *string hop*: a string constant that is a
module path (``"formtax.planted.backend"``, ``"formtax.vllm_plugin:FormtaxLogitsProcessor"``, the constant head
of ``f"formtax.tasks.{m}"``) is a module resolved on use (``importlib``, vLLM's ``--logits-processors``), a
dependency like an import, so it counts in the cycle check, and it may only name a module of its own layer (a
package's lazy table of its own modules, the strategy catalog); a module that needs one of another layer imports
it, down the order. Docstrings are documentation and prose mentioning a module (an error message) is not a path:
neither counts. The root package ``formtax`` is the facade (its public names are lazy, its own imports type-only)
and holds ``__version__``, which any module may import.
"""

from __future__ import annotations

import ast
import collections
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

# Bottom to top. A module may import its own layer (no cycle, by the check below) and any layer beneath it. A prefix
# names a package or module; a module takes the layer of its longest listed prefix.
VLLM_ENGINE = ("formtax.backends.vllm", "formtax.vllm_plugin")  # the package; the path users give vLLM
STRATEGY_ROWS = "formtax.backends.vllm.rows"  # the plugin's rows for a stock server's clients
# the tasks package's modules; the package itself (formtax.tasks, whose get_task is the catalog's) sits with the catalog
TASK_MODULES = tuple(f"formtax.tasks.{m}" for m in (
    "aime", "arc", "arith", "base", "csqa", "gsm8k", "imdb", "io", "jsonl", "kinds", "lastletter", "prompts",
    "registry", "rng", "svamp", "vocab"))
# the studies' and the planted world's tasks (with the data and scoring they read), which the task catalog imports
TASK_PLUGINS = ("formtax.studies.eae.task", "formtax.studies.eae.data", "formtax.studies.eae.scoring",
                "formtax.studies.abstention.task", "formtax.studies.abstention.data",
                "formtax.studies.abstention.scoring", "formtax.studies.summeval.task", "formtax.planted.task")
# the report's registry of analyses and what the analyses read of the report
REPORT_BASE = ("formtax.report.analyses", "formtax.report.matrices", "formtax.report.comparisons")
# the analyses (a study's own statistics, the FEM's and paper 003's tables), which the analysis catalog imports
ANALYSIS_PLUGINS = ("formtax.report.fem", "formtax.report.paper003", "formtax.studies.abstention.analyses",
                    "formtax.studies.abstention.extra", "formtax.studies.abstention.frame",
                    "formtax.studies.abstention.language", "formtax.studies.abstention.tables",
                    "formtax.studies.eae.report", "formtax.studies.summeval.judge")
LAYERS: tuple[tuple[str, ...], ...] = (
    ("formtax.errors", "formtax.tensorops", "formtax.cache", "formtax._lazy", "formtax.bytetok"),
    ("formtax.constraints",),   # specs, the compile cache, per-request matchers
    TASK_MODULES,               # benchmark tasks and prompts (they read constraints' templates, nothing above)
    ("formtax.decoding",),      # the engine protocol, policies, lowering, the decode loop
    ("formtax.fem",),           # Deco-G's format estimation module (HMM, token DFA, reweighting)
    # engines that know no strategy: transformers, fake, OpenAI-compatible servers, model files; the planted
    # worlds' engine (a world file and the lab's prompt templates make its logits)
    ("formtax.backends.hf", "formtax.backends.fake", "formtax.backends.openai_backend", "formtax.backends.model_files",
     "formtax.planted.backend", "formtax.planted.world"),
    ("formtax.strategies",),    # strategies: requests -> policies -> results
    VLLM_ENGINE,                # the vLLM engine: its plugin builds strategies' rows inside vLLM's engine
    ("formtax.backends",),      # the engines' registry (load_backend, by name)
    ("formtax.api", "formtax.streaming"),  # the library's entry points
    ("formtax.parsing",),       # strict / lenient answer parsers
    ("formtax.scoring",),
    ("formtax.records", "formtax.stats"),
    TASK_PLUGINS,               # the tasks of the studies and the planted worlds
    ("formtax.tasks", "formtax.tasks.catalog"),  # every built-in task imported, get_task (issue 56: no string hop)
    ("formtax.runner",),        # grids, resumable runs, parallel execution
    REPORT_BASE,                # the analyses' registry, the score matrices and contrasts they read
    ANALYSIS_PLUGINS,           # the studies' and the strategies' own analyses
    ("formtax.report.catalog",),  # every built-in analysis imported, the lookups the writers use
    ("formtax.report",),        # generic tables, figures, verification
    ("formtax.planted", "formtax.studies"),  # calibration worlds; studies (task + scoring + analyses each)
    ("formtax.integrations", "formtax.serve"),  # transformers' LogitsProcessor, vLLM's reasoning parser, formtax serve
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


MODULE_PATH = re.compile(r"formtax(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_][\w.]*)?")  # a module, or module:attribute


def string_hops(mods: dict[str, Path], package: str = "formtax") -> dict[str, set[str]]:
    """module -> the package modules its string constants name as a whole module path (module docstring).

    A string counts when all of it, stripped (and without a trailing dot: the constant head of an f-string), is a
    path; it names the deepest module that exists, and a path that only reaches the root package (an attribute of
    the facade, a field named ``formtax.answer``) names none. Strings standing alone as statements (docstrings)
    are documentation."""

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return None if name in ("", package) else name

    graph: dict[str, set[str]] = collections.defaultdict(set)
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in docs:
                continue
            text = node.value.strip().removesuffix(".")
            if MODULE_PATH.fullmatch(text) and text.split(".", 1)[0] == package:
                hit = resolve(text.partition(":")[0])
                if hit is not None and hit != name:
                    graph[name].add(hit)
    return graph


def cycle_hops(hops: dict[str, set[str]], mods: dict[str, Path]) -> dict[str, set[str]]:
    """The hops the cycle check counts: all but a package's lazy table of its own modules (its ``__init__``) and its
    catalog (a module named ``catalog``, the strategies': the modules it names import the package back)."""
    out = {}
    for a, bs in hops.items():
        table = mods[a].name == "__init__.py" or a.rpartition(".")[2] == "catalog"
        pkg = a if mods[a].name == "__init__.py" else a.rpartition(".")[0]
        out[a] = {b for b in bs if not (table and (b == pkg or b.startswith(pkg + ".")))}
    return out


def union(*graphs: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = collections.defaultdict(set)
    for g in graphs:
        for a, bs in g.items():
            out[a] |= bs
    return out


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


def across(hops: dict[str, set[str]]) -> list[str]:
    """String hops that leave their layer, either way (a module that needs another layer's module imports it)."""
    bad = []
    for a in sorted(hops):
        for b in sorted(hops[a]):
            la, lb = layer_of(a), layer_of(b)
            if la is not None and lb is not None and la != lb:
                bad.append(f"{a} (layer {la}: {LAYERS[la][0]}) names {b} (layer {lb}: {LAYERS[lb][0]})")
    return bad


MODULES = modules()
GRAPH = imports(MODULES)
DECODING, STRATEGIES = layer_of("formtax.decoding"), layer_of("formtax.strategies")
HOPS = string_hops(MODULES)


def test_every_module_has_a_layer() -> None:
    missing = sorted(m for m in modules() if m != "formtax" and layer_of(m) is None)
    assert not missing, f"place these modules in LAYERS: {missing}"


def test_no_import_cycle() -> None:
    """Imports and string hops together: a module resolved on use is a dependency too (a package's own lazy table
    or catalog of its modules aside)."""
    assert cycles(union(GRAPH, cycle_hops(HOPS, MODULES)), skip=frozenset({"formtax"})) == []


def test_imports_only_go_down_the_layers() -> None:
    assert upward(GRAPH) == []


def test_no_string_hop_across_layers() -> None:
    assert across(HOPS) == []


def test_no_backend_imports_a_strategy() -> None:
    """Engines step policies, never strategies: only the vLLM plugin's rows for a stock server's clients (built inside
    vLLM's engine from a strategy's name and answer, where formtax's own backend sends a policy recipe) import one."""
    bad = sorted((a, b) for a, bs in GRAPH.items() if a.startswith("formtax.backends") and a != STRATEGY_ROWS
                 for b in bs if b.startswith("formtax.strategies"))
    assert bad == []
    assert any(b.startswith("formtax.strategies") for b in GRAPH[STRATEGY_ROWS])  # the exception is still needed


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
    assert upward(graph) == [f"formtax.decoding.loop (layer {DECODING}: formtax.decoding) imports "
                             f"formtax.strategies.base (layer {STRATEGIES}: formtax.strategies)"]


def test_the_checks_catch_a_string_hop(tmp_path: Path) -> None:
    """The checker itself: a module path in a string (whole, or an f-string's head) is a hop, counted in cycles
    and refused across layers; the same path in a docstring or inside a sentence is not."""
    pkg = tmp_path / "formtax"
    (pkg / "decoding").mkdir(parents=True)
    (pkg / "strategies").mkdir()
    for p in (pkg, pkg / "decoding", pkg / "strategies"):
        (p / "__init__.py").write_text("")
    (pkg / "decoding" / "loop.py").write_text(
        '"""Loads formtax.strategies.basic."""\n'
        'import importlib\n'
        'PLUGIN = "formtax.strategies.base:S"\n'
        'def f(m):\n    """formtax.strategies.basic"""\n    return importlib.import_module(f"formtax.strategies.{m}")\n'
        'MESSAGE = "formtax.strategies.basic is not loaded"\n')
    (pkg / "strategies" / "base.py").write_text("from ..decoding.loop import f\nS = 1\n")
    (pkg / "strategies" / "basic.py").write_text("X = 'formtax.token_ids'\n")
    mods = modules(tmp_path)
    hops = string_hops(mods)
    assert dict(hops) == {"formtax.decoding.loop": {"formtax.strategies", "formtax.strategies.base"}}
    assert cycles(imports(mods)) == []
    assert cycles(union(imports(mods), cycle_hops(hops, mods))) == [["formtax.decoding.loop",
                                                                      "formtax.strategies.base"]]
    assert across(hops) == [f"formtax.decoding.loop (layer {DECODING}: formtax.decoding) names {name} (layer "
                            f"{STRATEGIES}: formtax.strategies)" for name in ("formtax.strategies",
                                                                               "formtax.strategies.base")]
