"""``formtax calibrate``: run the lab on a planted world and put each reported number next to its exact truth;
and the coverage study that checks the report's intervals cover the truth 95% of the time.

A calibration run is an ordinary run (``runner.run`` into ``OUT/run``, the report's own tables over its records)
plus the exact truths of the same grid (:mod:`formtax.planted.truth`). Every quantity gets a row: *planted* (what
the world's author intends, ``study.planted``), *exact* (what the lab's definitions imply), *estimate* with the
report's 95% interval, and whether the interval covers the exact truth. Under greedy decoding the run must also
reproduce the exact output of every request token for token (``records_differing``).

The coverage study (:func:`coverage_study`) is a simulation-based calibration of the statistics: each synthetic
study draws items (with replacement) from the world's items and, per item, seed and strategy, one record from
that request's exact outcome distribution; the report's own table functions then compute their intervals, and
coverage is the share of studies whose interval holds the population truth. A strategy duplicated with
independent draws gives a null pair whose paired-test p-values should be uniform (Kolmogorov-Smirnov statistic).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from formtax.errors import ConfigError
from formtax.planted.backend import PlantedBackend
from formtax.planted.task import planted_task
from formtax.planted.truth import UNRESOLVED_LIMIT, GridTruth, RequestTruth, grid_truth, population_truths
from formtax.planted.world import World, load_world, write_world
from formtax.planted.worlds import BUILTIN
from formtax.report.comparisons import pair_difference
from formtax.runner import RunConfig
from formtax.stats import Resampling

Key = tuple[str, ...]

# (table, estimate column) per quantity kind; intervals are <col>_low / <col>_high in the same row.
_TABLE_OF = {"accuracy": "accuracy", "paired": "paired", "decomposition": "decomposition"}


def resolve_world(name: str, out_dir: Path) -> Path:
    """A world file path, or a built-in world's name (written to ``out_dir/world.json``)."""
    if name in BUILTIN:
        path = out_dir / "world.json"
        world = BUILTIN[name]()
        if not path.is_file() or load_world(path).model_dump(exclude={"sha256"}) != world.model_dump(exclude={"sha256"}):
            write_world(world, path)
        return path
    p = Path(name)
    if not p.is_file():
        raise ConfigError(f"world {name!r} is neither a file nor a built-in world ({', '.join(BUILTIN)})")
    return p


def study_config(world: World, path: Path, strategies: list[str] | None = None, seeds: int | None = None,
                 temperature: float | None = None, max_tokens: int | None = None, batch_size: int = 16,
                 reasoning_tokens: int | None = None, fem: str | None = None) -> RunConfig:
    st = world.study
    if fem is None and isinstance(st.get("fem"), str):
        fem = str(st["fem"])
    if reasoning_tokens is None and st.get("reasoning_tokens") is not None:
        reasoning_tokens = int(st["reasoning_tokens"])
    return RunConfig(task="planted", strategies=strategies or list(st.get("strategies", ["free"])),
                     backend="planted", model=str(path.resolve()),
                     seeds=seeds if seeds is not None else int(st.get("seeds", 1)),
                     temperature=temperature if temperature is not None else float(st.get("temperature", 0.0)),
                     max_tokens=max_tokens if max_tokens is not None else int(st.get("max_tokens", 128)),
                     reasoning_tokens=reasoning_tokens, batch_size=batch_size, fem=fem,
                     task_options={"world": str(path.resolve())}, closing=False)  # the truths' rule does not close


def world_fem(world: World, path: Path, out_dir: Path) -> str | None:
    """The FEM a world's study asks for: a file (``"fem": "FILE"``), or one distilled from the planted model
    itself (``"fem": {"distill": {...}}``: :class:`~formtax.runner.distill.DistillConfig` fields, instruction-aware,
    greedy, n-gram initialisation), written once to ``out_dir/fem.npz`` and reused while the world is unchanged."""
    spec = world.study.get("fem")
    if spec is None or isinstance(spec, str):
        return spec
    from formtax.fem.artifact import load_fem, save_fem
    from formtax.runner.distill import DistillConfig, build_fem

    target = out_dir / "fem.npz"
    if target.is_file() and load_fem(str(target)).meta.get("world_sha256") == world.sha256:
        return str(target)
    opts = dict(spec.get("distill", {})) if isinstance(spec, dict) else {}
    try:
        cfg = DistillConfig(task="planted", init="ngram", **opts)
    except TypeError as e:
        raise ConfigError(f"world {world.name}: study.fem.distill: {e}") from None
    backend = PlantedBackend(world, str(path.resolve()))
    hmm, meta = build_fem(backend, cfg, task=planted_task(world, str(path.resolve())))
    meta["world_sha256"] = world.sha256
    return str(save_fem(target, hmm, meta))


def planted_key(text: str) -> Key:
    """``"decomposition/inwriting/format_gain"`` -> ``("decomposition", "inwriting", "format_gain")``."""
    return tuple(text.split("/"))


def lookup(tables: dict[str, pd.DataFrame], key: Key) -> tuple[float, float, float]:
    """(estimate, low, high) of a truth key in the report's tables (NaN where the table has no such row)."""
    kind = key[0]
    t = tables.get(_TABLE_OF.get(kind, ""))
    nan = (math.nan, math.nan, math.nan)
    if t is None or t.empty:
        return nan
    if kind == "accuracy":
        rows, col = t[t["strategy"] == key[1]], key[2]
    elif kind == "paired":
        if key[3] == "diff":  # the table orients each pair its own way: read it as key[1] - key[2]
            found = pair_difference(t, key[1], key[2])
            return nan if found is None else found
        rows, col = t[((t["strategy"] == key[1]) & (t["baseline"] == key[2]))
                      | ((t["strategy"] == key[2]) & (t["baseline"] == key[1]))], key[3]
    else:
        rows, col = t[t["base_strategy"] == key[1]], key[2]
    if rows.empty or col not in rows:
        return nan
    r = rows.iloc[0]
    return float(r[col]), float(r.get(f"{col}_low", math.nan)), float(r.get(f"{col}_high", math.nan))


@dataclass
class Row:
    quantity: str
    planted: float | None
    exact: float
    estimate: float
    low: float
    high: float

    @property
    def covered(self) -> bool | None:
        if any(math.isnan(x) for x in (self.exact, self.low, self.high)):
            return None
        return self.low - 1e-9 <= self.exact <= self.high + 1e-9


@dataclass
class Calibration:
    world: str
    run_dir: str
    config: dict[str, Any]
    rows: list[Row]
    records: int
    records_differing: int | None  # greedy only: records whose text differs from the exact output
    max_unresolved: float
    notes: list[str] = field(default_factory=list)
    fit_p: float | None = None  # sampled runs: distribution_fit (Bonferroni-adjusted smallest chi-square p)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for r, row in zip(d["rows"], self.rows, strict=True):
            r["covered"] = row.covered
        return d


def _records_differing(g: GridTruth, run_dir: Path) -> tuple[int, int]:
    """Greedy runs: how many records differ from the exact output (text and strict score)."""
    from formtax.records.store import RECORDS, read_records

    n = bad = 0
    for rec in read_records(run_dir / RECORDS):
        n += 1
        t = g.by_key.get((rec.strategy, rec.item_id, rec.prompt_variant, 0))
        if t is None:
            bad += 1
            continue
        o = t.outcomes[0]
        if rec.error is not None:
            bad += int(o.scored)
            continue
        if not o.scored or rec.text != o.text or float(rec.scores.get("strict", False)) != o.strict or o.t_star is not None and rec.stats.get("t_star") != o.t_star or o.masked_mass is not None and not math.isclose(rec.masked_mass or 0.0, o.masked_mass, abs_tol=1e-9):
            bad += 1
    return n, bad


def distribution_fit(g: GridTruth, run_dir: Path) -> float | None:
    """Sampled runs: does every request's spread of outputs over its seeds follow its exact distribution? Per
    request, Pearson's chi-square of the records' texts against the exact outcome probabilities (outcomes
    expected fewer than 5 times pooled into one cell); returned is the Bonferroni-adjusted smallest p-value over
    the requests (None when no request has two cells). A small value points at the sampler, a policy's
    renormalisation or the enumerator, request by request, where the accuracy's interval only sees the mean."""
    from scipy import stats as sstats

    from formtax.records.store import RECORDS, read_records

    texts: dict[tuple[str, str, str], list[str]] = {}
    for rec in read_records(run_dir / RECORDS):
        texts.setdefault((rec.strategy, rec.item_id, rec.prompt_variant), []).append(
            rec.text if rec.error is None else "\x00error")
    ps: list[float] = []
    for (strategy, item, variant), seen in texts.items():
        t = g.by_key.get((strategy, item, variant, 0))
        if t is None:
            continue
        exact: dict[str, float] = {}
        for o in t.outcomes:
            key = o.text if o.scored else "\x00error"
            exact[key] = exact.get(key, 0.0) + o.p
        n = len(seen)
        big = [k for k, q in exact.items() if q * n >= 5]
        obs = [sum(1 for x in seen if x == k) for k in big]
        exp = [exact[k] * n for k in big]
        rest_obs, rest_exp = n - sum(obs), n - sum(exp)
        if rest_exp >= 1e-9 * n or rest_obs:
            obs.append(rest_obs)
            exp.append(max(rest_exp, 1e-12))
        if len(obs) < 2:
            continue
        ps.append(float(sstats.chisquare(obs, np.array(exp) * n / sum(exp)).pvalue))
    return min(1.0, min(ps) * len(ps)) if ps else None


def calibrate(world_arg: str, out_dir: Path, strategies: list[str] | None = None, seeds: int | None = None,
              temperature: float | None = None, max_tokens: int | None = None, n_resamples: int = 10_000,
              progress: Callable[[int, int], None] | None = None, reasoning_tokens: int | None = None,
              fem: str | None = None) -> Calibration:
    from formtax.report.load import load_records
    from formtax.report.tables import compute_tables
    from formtax.runner import run

    out_dir.mkdir(parents=True, exist_ok=True)
    path = resolve_world(world_arg, out_dir)
    world = load_world(path)
    if fem is None:
        fem = world_fem(world, path, out_dir)
    config = study_config(world, path, strategies, seeds, temperature, max_tokens,
                          reasoning_tokens=reasoning_tokens, fem=fem)
    backend = PlantedBackend(world, str(path.resolve()))
    task = planted_task(world, str(path.resolve()))
    g = grid_truth(backend, task, config)  # before the run: a world without an exact truth is refused early
    notes = []
    if g.max_unresolved > UNRESOLVED_LIMIT:
        raise ConfigError(f"world {world.name}: under these settings a request leaves the world's paths with "
                          f"probability {g.max_unresolved:.2g} (> {UNRESOLVED_LIMIT:g}), so its exact truth is "
                          "not finite; give the world continuations the masks allow (e.g. after_end)")
    run_dir = out_dir / "run"
    run(config, run_dir, progress, backend=backend)
    df = load_records(run_dir)
    tables = compute_tables(df, n_resamples=n_resamples, seed=0)
    truths = population_truths(g)
    planted = {planted_key(k): float(v) for k, v in world.study.get("planted", {}).items()}
    rows = []
    for key, exact in truths.items():
        est, low, high = lookup(tables, key)
        rows.append(Row("/".join(key), planted.get(key), exact, est, low, high))
    meta = {it.id: dict(it.meta) for it in world.items}
    if any("pair" in m for m in meta.values()) and {"short", "constrained"} <= set(config.strategies):
        from formtax.planted.languages import d_paired_estimate, d_paired_truth, pair_truths

        est, low, high = d_paired_estimate(df, meta, n_resamples)
        key = ("d_paired", "short", "constrained")
        rows.append(Row("/".join(key), planted.get(key), d_paired_truth(pair_truths(g)), est, low, high))
        truths[key] = rows[-1].exact
    for key in planted.keys() - truths.keys():
        notes.append(f"planted {'/'.join(key)} has no exact counterpart in this grid")
    n, bad = _records_differing(g, run_dir)
    cal = Calibration(world.name, str(run_dir), asdict(config), rows, n,
                      bad if config.temperature <= 0.0 else None, g.max_unresolved, notes)
    if config.temperature > 0.0:
        cal.fit_p = distribution_fit(g, run_dir)
    (out_dir / "calibration.json").write_text(json.dumps(cal.to_json(), indent=1, default=str) + "\n",
                                              encoding="utf-8")
    (out_dir / "calibration.md").write_text(render(cal) + "\n", encoding="utf-8")
    return cal


def _fmt(x: float | None) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"


def render(cal: Calibration) -> str:
    lines = [f"# Calibration: world {cal.world}", "",
             f"{cal.records} records in {cal.run_dir}; "
             + (f"records differing from the exact output: {cal.records_differing}; "
                if cal.records_differing is not None else "")
             + (f"outputs vs exact distributions (chi-square per request, Bonferroni): p = {cal.fit_p:.3g}; "
                if cal.fit_p is not None else "")
             + f"largest unresolved probability {cal.max_unresolved:.2g}", "",
             "| quantity | planted | exact | estimate | 95% interval | covers exact |", "|---|---|---|---|---|---|"]
    for r in cal.rows:
        cov = {True: "yes", False: "**no**", None: ""}[r.covered]
        iv = "" if math.isnan(r.low) else f"[{r.low:.4f}, {r.high:.4f}]"
        lines.append(f"| {r.quantity} | {_fmt(r.planted)} | {_fmt(r.exact)} | {_fmt(r.estimate)} | {iv} | {cov} |")
    lines += [f"- {n}" for n in cal.notes]
    return "\n".join(lines)


# -- the coverage study ----------------------------------------------------------------------------------------

NULL_SUFFIX = "~null"


def _draw(t: RequestTruth, rng: np.random.Generator) -> tuple[float, float, float, float, bool]:
    ps = np.array([o.p for o in t.outcomes], dtype=np.float64)
    o = t.outcomes[int(rng.choice(len(ps), p=ps / ps.sum()))]
    return o.strict, o.lenient, o.parse_ok, o.format_ok, o.scored


def synthetic_frame(g: GridTruth, rng: np.random.Generator, n_items: int, n_seeds: int,
                    null_of: str | None = None) -> pd.DataFrame:
    """One synthetic study in the report's record-frame layout (the columns its table functions read)."""
    from formtax.runner.grid import parse_strategy_spec

    picks = rng.integers(0, len(g.items), size=n_items)
    cells = [(s, s) for s in g.strategies] + ([(null_of + NULL_SUFFIX, null_of)] if null_of else [])
    rows: list[dict[str, Any]] = []
    nan = math.nan
    for name, source in cells:
        spec = parse_strategy_spec(source)
        by_item = {t.planned.item.id: t for t in g.cell(source)}
        for k, idx in enumerate(picks):
            t = by_item[g.items[int(idx)]]
            for seed in range(n_seeds):
                strict, lenient, parse_ok, format_ok, scored = _draw(t, rng)
                rows.append({"task": "planted", "strategy": name, "base_strategy": spec.name + (
                    NULL_SUFFIX if name != source else ""), "level": spec.level, "rc": spec.rc,
                    "item_id": f"s{k:04d}", "seed": seed, "prompt_variant": "t1f1", "scored": scored,
                    "score_strict": strict if scored else nan, "score_lenient": lenient if scored else nan,
                    "parse_ok_strict": parse_ok if scored else nan, "format_ok": format_ok if scored else nan})
    return pd.DataFrame(rows)


@dataclass
class Coverage:
    """What :func:`coverage_study` measured.

    ``by_type[resampling][interval type]`` holds ``coverage`` (share of intervals holding the truth), ``n``
    (intervals counted) and ``mean_width``. A quantity whose interval had zero width in every study (its truth
    is deterministic, e.g. a parse rate of exactly 1) is left out of the coverage and listed in ``degenerate``.
    The paired test: ``paired_ks`` is the KS statistic of the report's per-item paired p-values on the null pair
    (the same strategy drawn twice) against uniform, with its p-value, and ``paired_reject_05`` the share of
    studies rejecting at 0.05. The test is a permutation test, so its p-values are discrete (the more so the
    fewer discordant items) and valid (rejection at most 0.05) rather than exactly uniform;
    ``paired_randomized_ks`` is the KS statistic of its randomised p-values ``P(|T| > |t|) + U P(|T| = |t|)``,
    exactly uniform when the test's null distribution is right.
    """

    n_studies: int
    n_items: int
    n_seeds: int
    by_type: dict[str, dict[str, dict[str, float]]]
    by_quantity: dict[str, dict[str, float]]
    degenerate: list[str] = field(default_factory=list)
    paired_ks: float | None = None
    paired_ks_p: float | None = None
    paired_reject_05: float | None = None
    paired_randomized_ks: float | None = None
    paired_randomized_ks_p: float | None = None
    null_false_findings: float | None = None
    """On the null pair: the share of studies whose finding calls the difference distinguishable (the paired
    interval of the first resampling rule excludes 0 and the paired test rejects at 0.05)."""


def _randomized_paired_p(df: pd.DataFrame, null_of: str, rng: np.random.Generator) -> float:
    """The null pair's randomised sign-flip p-value (``Coverage``), from the same per-item means."""
    from formtax.report.comparisons import strict_matrices
    from formtax.stats.paired_test import sign_flip_tail

    (a, b), _, n_runs = strict_matrices([df[df["strategy"] == null_of], df[df["strategy"] == null_of + NULL_SUFFIX]])
    k = np.rint((a.mean(axis=1) - b.mean(axis=1)) * n_runs).astype(np.int64)
    greater, equal = sign_flip_tail(k[k != 0])
    return greater + float(rng.uniform()) * equal


def _kind(key: Key) -> str:
    return key[0] if key[0] != "accuracy" else key[-1]


def coverage_study(g: GridTruth, n_studies: int = 400, n_items: int = 40, n_seeds: int = 3,
                   n_resamples: int = 2000, seed: int = 0, null_of: str | None = None,
                   progress: Callable[[int], None] | None = None,
                   resamplings: tuple[Resampling, ...] = (Resampling.CORRECTED, Resampling.ITEMS_AND_SEEDS,
                                                         Resampling.ITEMS),
                   ) -> Coverage:
    """Coverage of every interval the report prints, over ``n_studies`` synthetic studies (module docstring),
    under each bootstrap ``resampling`` rule on the same synthetic studies."""
    from scipy import stats as sstats

    from formtax.report.comparisons import decomposition_table, paired_table
    from formtax.report.tables import accuracy_table

    if not resamplings:
        raise ValueError("coverage_study needs at least one resampling rule")
    truths = population_truths(g)
    rng = np.random.default_rng(seed)
    hits: dict[tuple[str, Key], list[float]] = {}
    at_truth: dict[Key, list[bool]] = {}
    widths: dict[tuple[str, Key], list[float]] = {}
    pvals: list[float] = []
    randomized: list[float] = []
    false_findings: list[bool] = []
    for k in range(n_studies):
        df = synthetic_frame(g, rng, n_items, n_seeds, null_of)
        first: pd.DataFrame | None = None
        for rs in resamplings:
            tables = {"accuracy": accuracy_table(df, n_resamples, k, rs),
                      "paired": paired_table(df, n_resamples, k, rs),
                      "decomposition": decomposition_table(df, n_resamples, k, rs)}
            for key, exact in truths.items():
                est, low, high = lookup(tables, key)
                if math.isnan(low) or math.isnan(exact):
                    continue
                if exact in (0.0, 1.0) and est == exact:
                    at_truth.setdefault(key, []).append(True)
                hits.setdefault((rs.value, key), []).append(float(low - 1e-9 <= exact <= high + 1e-9))
                widths.setdefault((rs.value, key), []).append(high - low)
            first = tables["paired"] if first is None else first
        if null_of and first is not None:
            pair = {null_of, null_of + NULL_SUFFIX}
            row = first[first["strategy"].isin(pair) & first["baseline"].isin(pair)]
            if not row.empty and not math.isnan(float(row.iloc[0]["paired_p"])):
                r = row.iloc[0]
                pvals.append(float(r["paired_p"]))
                randomized.append(_randomized_paired_p(df, null_of, rng))
                false_findings.append(bool((r["diff_low"] > 0 or r["diff_high"] < 0) and r["paired_p"] < 0.05))
        if progress:
            progress(k + 1)
    # deterministic truths: zero-width intervals, or a truth of 0 or 1 that every study estimates exactly
    n_seen = {key: len(h) for (_, key), h in hits.items()}
    degenerate = sorted({"/".join(key) for (_, key), w in widths.items()
                         if max(w) <= 1e-12 or len(at_truth.get(key, [])) == n_seen[key] * len(resamplings)})
    by_type: dict[str, dict[str, dict[str, float]]] = {}
    for (rule, key), h in hits.items():
        if "/".join(key) in degenerate:
            continue
        agg = by_type.setdefault(rule, {}).setdefault(_kind(key), {"hits": 0.0, "n": 0.0, "width": 0.0})
        agg["hits"] += sum(h)
        agg["n"] += len(h)
        agg["width"] += sum(widths[(rule, key)])
    out = {rs: {kind: {"coverage": v["hits"] / v["n"], "n": v["n"], "mean_width": v["width"] / v["n"]}
                for kind, v in kinds.items()} for rs, kinds in by_type.items()}
    by_quantity: dict[str, dict[str, float]] = {}
    for (rule, key), h in hits.items():
        by_quantity.setdefault("/".join(key), {})[rule] = float(np.mean(h))
    cov = Coverage(n_studies, n_items, n_seeds, out, by_quantity, degenerate)
    if pvals:
        ks = sstats.kstest(pvals, "uniform")
        cov.paired_ks, cov.paired_ks_p = float(ks.statistic), float(ks.pvalue)
        cov.paired_reject_05 = float(np.mean(np.array(pvals) < 0.05))
        ks = sstats.kstest(randomized, "uniform")
        cov.paired_randomized_ks, cov.paired_randomized_ks_p = float(ks.statistic), float(ks.pvalue)
        cov.null_false_findings = float(np.mean(false_findings))
    return cov


def render_coverage(cov: Coverage, null_of: str | None = None) -> str:
    """The coverage study as Markdown: one row per interval type and resampling rule, then the paired test."""
    lines = [f"## Coverage over {cov.n_studies} synthetic studies of {cov.n_items} items x {cov.n_seeds} seeds", "",
             "| interval type | resampling | coverage | intervals | mean width |", "|---|---|---|---|---|"]
    for rs, kinds in cov.by_type.items():
        for kind, v in kinds.items():
            lines.append(f"| {kind} | {rs} | {v['coverage']:.3f} | {int(v['n'])} | {v['mean_width']:.3f} |")
    if cov.degenerate:
        lines.append(f"\nDeterministic truths (zero-width in every study, not counted): {', '.join(cov.degenerate)}")
    if cov.paired_ks is not None:
        lines.append(f"\nPaired test under the null pair ({null_of}): KS against uniform {cov.paired_ks:.3f} "
                     f"(p {cov.paired_ks_p:.3g}), rejection rate at 0.05 {cov.paired_reject_05:.3f}; randomised "
                     f"p-values KS {cov.paired_randomized_ks:.3f} (p {cov.paired_randomized_ks_p:.3g})")
    return "\n".join(lines)
