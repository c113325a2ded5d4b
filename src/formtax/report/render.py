"""Render the tables and figures as ``report.md`` and a self-contained ``report.html``."""

from __future__ import annotations

import base64
import html
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from formtax.report.drilldown import DEFAULT_DRILL_ITEMS, drilldown_html
from formtax.report.drilldown import STYLE as DRILL_STYLE
from formtax.report.figures import FIGURES
from formtax.report.matrices import CONFIDENCE, DECIMALS, is_p_column
from formtax.stats.paired_test import format_p

DESCRIPTIONS: dict[str, str] = {
    "findings": (
        "Plain sentences generated from the tables (formtax.report.findings), each number with its 95% interval "
        "or paired test; `formtax verify` recomputes them and checks that this report prints exactly these."
    ),
    "summary": (
        "Per task x strategy: strict accuracy with its 95% interval, the strict parse rate (the task's strict "
        "parser: the requested shape with the answer in its canonical spelling), the format-level parse rate "
        "(paper 003's: the requested shape, whatever the answer's spelling) and mean generated tokens. Counts, lenient scores, timing: the detailed tables."
    ),
    "accuracy": (
        "Accuracy per task x strategy under the strict and lenient parsers, the strict and the format-level parse "
        "rates: "
        "the mean of the items x runs score matrix (run = seed x prompt variant) after dropping items "
        "with an unscored or absent entry (n_items_dropped)."
    ),
    "runs": (
        "Per-run accuracy (over that run's scored items), then mean and sample std over runs "
        "(seed x prompt variant), paper 003's way."
    ),
    "decomposition": (
        "Paper 003's decomposition per task and base strategy: strict accuracy at each constraint level on "
        "common items x runs; format_gain = fc - none, validity_gain = vc - fc, reasoning_gain = vc_rc - vc, "
        "total_gain = most constrained level - none, with paired bootstrap intervals (_low, _high) and, as paper "
        "003 reports its gains (mean +- std), the sample std of the gain over runs (seed x prompt variant; _std, "
        "n/a at one run). The strategy_<level> columns give the level -> strategy mapping (none = unconstrained, "
        "vc = fc+vc, vc_rc = fc+vc+rc)."
    ),
    "paired": (
        "Comparisons with the baseline strategy (every pair: tables/paired.csv), on the items and runs both scored: "
        "diff = acc_strategy - acc_baseline (strict; every difference in this report has this sign); "
        "n_only_strategy / n_only_baseline = item x run pairs only that side got right; paired_p is a "
        "per-item test (the item is the unit: a sign-flip permutation test on per-item mean differences over "
        "runs, McNemar's exact test at one run); items_strategy_better / items_baseline_better are the discordant "
        "items. A pair without the report's baseline is oriented against the strategy the run lists first."
    ),
    "tokens": "Mean tokens per scored request: prompt, generated total, forced, and generated per phase; then "
              "closing mode's footprint: records decoded with it, those where it changed the model's own choice "
              "(the budget bound the answer), and the mean number of tokens it changed (0: invisible).",
    "outcomes": "How requests ended, per strategy: each finish reason (length = the budget cut the output) and, for "
                "InWriting, each switch reason (eos = the model wanted to stop, trigger, budget = the budget forced "
                "the switch), with counts and shares over every record.",
    "timing": (
        "Seconds per scored request: wall clock (mean, median, total over the cell), its share of the batch's "
        "wall time (share_s), throughput (generated tokens per second of that share), its share of the batch's "
        "process CPU time (cpu_s) and CPU per wall second (about the cores in use); the manifest records the "
        "machine's load average when the run started and stopped."
    ),
}

_WITH_BOOTSTRAP = {"summary", "accuracy", "decomposition", "paired"}
HEADLINE = "summary"
FINDINGS = "findings"
_FIRST = (FINDINGS, HEADLINE)  # rendered at the top, not among the detailed tables


@dataclass
class ReportContext:
    """What the renderers need besides the tables."""

    df: pd.DataFrame
    meta: dict[str, Any]
    manifest: dict[str, Any] | None
    figures: dict[str, Path]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)


def methods_used(table: pd.DataFrame | None, resampling: str = "") -> str:
    """The interval methods a table's rows actually used (its ``interval_used`` column), with how many rows took
    each (issue 60: below 20 items the intervals are exact, not bootstrap, and every footer and caption says
    so): ``clopper-pearson (items) (3 rows), percentile-bootstrap (1 row)``."""
    if table is None or "interval_used" not in table.columns:
        return "the rule in interval_method"
    counts: Counter[str] = Counter()
    for value in table["interval_used"]:
        if isinstance(value, str) and value:
            counts.update(dict.fromkeys(value.split("; "), 1))
    if not counts:
        return "none (no interval computed)"
    parts = []
    for method, n in counts.items():
        how = f" resampling {resampling}" if "bootstrap" in method and resampling else ""
        parts.append(f"{method}{how} ({n} row{'' if n == 1 else 's'})")
    return ", ".join(parts)


def _captions(tables: dict[str, pd.DataFrame] | None = None) -> dict[str, str]:
    """Figure captions; the generic figures name the interval methods their rows actually used (issue 60)."""
    from formtax.report.catalog import analyses

    tables = tables or {}
    used = {"parse": methods_used(tables.get("accuracy")), "accuracy": methods_used(tables.get("accuracy")),
            "paired": methods_used(tables.get("paired"))}
    own = {stem: caption.replace("{intervals}", used.get(stem, "")) for stem, caption in FIGURES.items()}
    return {**own, **{n: a.figure_caption for n, a in analyses().items() if a.figure is not None}}


def _description(name: str) -> str:
    from formtax.report.catalog import analyses

    return DESCRIPTIONS[name] if name in DESCRIPTIONS else analyses()[name].description


def _covered(name: str, table: pd.DataFrame) -> set[tuple[str, str]]:
    """The (task, strategy) cells a table's rows are about."""
    if name == FINDINGS:
        return {(str(t), "*") for t in table["task"]}
    if name == "decomposition":
        cols = [c for c in table.columns if c.startswith("strategy_")]
    elif name == "paired":
        cols = ["strategy", "baseline"]
    elif "strategy" in table.columns:
        cols = ["strategy"]
    else:  # an analysis over whole tasks: every record of its tasks (strategy "*")
        tasks = {str(t) for t in table["task"]} if "task" in table.columns else set()
        return {(t, "*") for t in tasks}
    return {(str(row["task"]), str(row[c])) for _, row in table.iterrows() for c in cols if str(row[c])}


def footer(name: str, table: pd.DataFrame, ctx: ReportContext) -> str:
    """The line under a table: n, unscored count, replicates, interval method."""
    cells = _covered(name, table)
    keys = list(zip(ctx.df["task"].astype(str), ctx.df["strategy"].astype(str), strict=True))
    mask = [key in cells or (key[0], "*") in cells for key in keys]
    sub = ctx.df[mask]
    n, unscored = len(sub), int((~sub["scored"]).sum())
    confidence = f"{100 * CONFIDENCE:g}%"
    from formtax.report.catalog import analyses

    boot = name in _WITH_BOOTSTRAP or (name in analyses() and analyses()[name].bootstrap)
    replicates = ctx.meta["n_resamples"] if boot else 0
    seed = f", bootstrap seed = {ctx.meta['seed']}" if boot else ""
    rule = str(ctx.meta.get("resampling", "items+seeds"))
    resampling = {"items+seeds": "items and runs jointly",
                  "items+seeds-corrected": "items and runs jointly, the spread corrected to the design's variance "
                                           "components"}.get(rule, "items, each with all its runs")
    if name in analyses():
        return (
            f"n = {n} records ({n - unscored} scored), unscored = {unscored}, replicates = {replicates}, "
            f"interval = {analyses()[name].method}{seed}."
        )
    method = {
        "findings": f"{confidence} intervals and paired tests of the accuracy and paired tables",
        "summary": f"{confidence}, as the accuracy table's rows used: "
                   f"{methods_used(ctx.tables.get('accuracy'), resampling)}",
        "accuracy": f"{confidence}, as the rows used: {methods_used(table, resampling)}",
        "decomposition": f"{confidence} by the rule in interval_method (exact below 20 items, else paired "
        f"percentile bootstrap over common items x runs, {resampling}; gains jointly)",
        "paired": f"{confidence}, as the rows used: {methods_used(table, resampling)}; p-value: per-item "
        "sign-flip test (McNemar's exact test at one run)",
        "runs": "none (mean and sample std, ddof=1, over runs)",
        "tokens": "none (means over scored records)",
        "timing": "none (mean, median, total over scored records)",
        "outcomes": "none (counts and shares over every record)",
    }[name]
    return (
        f"n = {n} records ({n - unscored} scored), unscored = {unscored}, replicates = {replicates}, "
        f"interval = {method}{seed}."
    )


def _text(value: Any) -> str:
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:.4g}"
    if value is None:
        return ""
    return str(value)


def _section(manifest: dict[str, Any], key: str) -> dict[str, Any]:
    value = manifest.get(key)
    return value if isinstance(value, dict) else {}


def manifest_lines(ctx: ReportContext) -> list[tuple[str, str]]:
    """(label, value) pairs for the report header."""
    lines = [("records model(s)", ", ".join(sorted(str(m) for m in ctx.df["model"].unique())))]
    manifest = ctx.manifest
    if manifest is None:
        lines.append(("manifest", "none (no manifest.json in the run directory)"))
    else:
        backend = _section(manifest, "backend")
        config = _section(manifest, "config")
        model = manifest.get("model") or backend.get("model") or config.get("model") or "unknown"
        git = _section(manifest, "git")
        commit = git.get("commit") or manifest.get("git_commit") or manifest.get("commit") or "unknown"
        if git.get("dirty"):
            commit = f"{commit} (uncommitted changes)"
        lines += [("model", str(model)), ("git commit", str(commit))]
        for k, source in enumerate(manifest.get("pooled_from") or []):
            lines.append((f"pooled run {k + 1}", str(source)))
        if len({str(m) for m in ctx.df["model"]}) > 1 and manifest.get("pooled_from"):
            lines.append(("pooled models", "each task is relabelled TASK | MODEL; every table, the study analyses "
                          "(metatool abstention, EAE, SummEval) included, is computed per model"))
        if manifest.get("status"):
            lines.append(("run status", str(manifest["status"])))
        for k, part in enumerate(r for r in manifest.get("resumptions") or [] if isinstance(r, dict)):
            machine, end = part.get("machine"), part.get("machine_at_end")
            if isinstance(machine, dict):
                load = f"load average (1, 5, 15 min) {machine.get('loadavg_1_5_15')} at start"
                if isinstance(end, dict):
                    load += f", {end.get('loadavg_1_5_15')} at end"
                lines.append((f"machine (session {k + 1}, {part.get('at')})",
                              f"{machine.get('cpus')} CPUs, {load}"))
        for key, value in config.items():
            shown = json.dumps(value, sort_keys=True, default=str)
            lines.append((f"config.{key}", shown if len(shown) <= 120 else shown[:117] + "..."))
    meta = ctx.meta
    lines += [
        ("formtax version", str(meta["formtax_version"])),
        ("records.jsonl sha256", str(meta["records_sha256"])),
        ("bootstrap", f"{meta['n_resamples']} replicates, seed {meta['seed']}"),
    ]
    return lines


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|#])")


def _md_cell(value: Any) -> str:
    """A value as Markdown text: every character Markdown or its inline HTML would interpret is escaped (model
    output and manifest strings reach the report; report.html escapes them too), newlines become spaces."""
    return _MD_SPECIAL.sub(r"\\\1", _text(value)).replace("\r", " ").replace("\n", " ")


def _md_value(column: str, value: Any) -> str:
    if is_p_column(column) and isinstance(value, float):
        return format_p(value)  # a tiny p-value prints as <1e-6, never as 0.0
    return _md_cell(value)


def markdown_table(table: pd.DataFrame) -> str:
    header = "| " + " | ".join(_md_cell(c) for c in table.columns) + " |"
    rule = "| " + " | ".join("---" for _ in table.columns) + " |"
    body = ["| " + " | ".join(_md_value(str(c), v) for c, v in zip(table.columns, row, strict=True)) + " |"
            for row in table.itertuples(index=False)]
    if not body:
        body = ["| " + " | ".join("" for _ in table.columns) + " |"]
    return "\n".join([header, rule, *body])


def split_tables(tables: dict[str, pd.DataFrame], baseline: str | None = None
                 ) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """The detailed tables with rows (report order, the findings and the headline left out) and the names of the
    empty ones, which the report lists instead of rendering a blank table (their CSV files are still written).
    The paired table shows the comparisons with ``baseline`` only (its CSV keeps every pair)."""
    rest = {n: t for n, t in tables.items() if n not in _FIRST}
    if baseline is not None and "paired" in rest:
        p = rest["paired"]
        rest["paired"] = p[p["baseline"].astype(str) == baseline]
    shown = {n: t for n, t in rest.items() if len(t)}
    empty = [n for n, t in rest.items() if not len(t)]
    return shown, empty


def findings_lines(tables: dict[str, pd.DataFrame]) -> list[str]:
    """The findings as report.md prints them, one Markdown bullet each (what ``formtax verify`` looks for)."""
    table = tables.get(FINDINGS)
    if table is None:
        return []
    several = table["task"].nunique() > 1
    return [f"- {'**' + _md_cell(r.task) + '**: ' if several else ''}{_md_cell(r.sentence)}"
            for r in table.itertuples(index=False)]


def headline_parts(tables: dict[str, pd.DataFrame]) -> list[tuple[str, pd.DataFrame]]:
    """The summary table split per task: ``(task, rows)``."""
    summary = tables.get(HEADLINE)
    if summary is None or summary.empty:
        return []
    return [(str(task), rows.drop(columns=["task"])) for task, rows in summary.groupby("task", sort=True)]


def render_markdown(tables: dict[str, pd.DataFrame], ctx: ReportContext) -> str:
    """report.md: findings first, then the summary, figures and detailed tables; provenance and configuration
    last (a reader meets the result before the machinery)."""
    baseline = ctx.meta.get("baseline")
    out = ["# formtax report", "", "## Findings", ""]
    out += findings_lines(tables) or ["No findings: the run has no scored records."]
    if baseline:
        out += ["", f"Comparisons are against the baseline `{_md_cell(baseline)}` (`formtax report --baseline`)."]
    out += ["", "## Summary", "", _description(HEADLINE), ""]
    for task, rows in headline_parts(tables):
        out += [f"### {_md_cell(task)}", "", markdown_table(rows), ""]
    if HEADLINE in tables:
        out += [footer(HEADLINE, tables[HEADLINE], ctx), ""]
    out += ["## Figures", ""]
    for stem, caption in _captions(tables).items():
        if stem in ctx.figures:
            out += [f"![{stem}](figures/{ctx.figures[stem].name})", "", caption, ""]
    shown, empty = split_tables(tables, baseline)
    out += ["## Detailed tables", "",
            "Numbers below show 4 significant digits; `tables/*.csv` hold every value rounded to "
            f"{DECIMALS} decimals, and `formtax verify` recomputes them from `records.jsonl`.", ""]
    if empty:
        out += [f"Empty for this run (not shown; their CSV files hold the header): {', '.join(empty)}.", ""]
    for name, table in shown.items():
        out += [f"### {name}", "", _description(name), "", markdown_table(table), "", footer(name, table, ctx), ""]
    out += ["Per-item outputs (prompt, text by phase, parses, gold) are in `report.html`, section Items.", "",
            "## Run configuration and provenance", ""]
    out += [f"- **{label}**: {_md_cell(value)}" for label, value in manifest_lines(ctx)]
    out.append("")
    return "\n".join(out)


def html_table(table: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_text(v))}</td>" for v in row) + "</tr>"
        for row in table.itertuples(index=False)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


_STYLE = (
    "body{font-family:sans-serif;margin:2em;}"
    "table{border-collapse:collapse;font-size:0.85em;margin:0.5em 0;}"
    "th,td{border:1px solid #bbb;padding:2px 6px;text-align:right;} th{background:#eee;}"
    ".footer{color:#444;font-size:0.9em;} .table-wrap{overflow-x:auto;} img{max-width:100%;height:auto;}"
    "ul.findings li{margin:0.3em 0;line-height:1.4;} @media (max-width:600px){body{margin:0.6em;}}"
    "details.table{margin:0.6em 0;} details.table>summary{font-size:1.15em;font-weight:bold;cursor:pointer;}"
)


def _html_section(name: str, table: pd.DataFrame, ctx: ReportContext) -> str:
    return (
        f'<details class="table" id="table-{html.escape(name)}"><summary>{html.escape(name)} '
        f"({len(table)} rows, {len(table.columns)} columns; tables/{html.escape(name)}.csv)</summary>"
        f"<p>{html.escape(_description(name))}</p>"
        f'<div class="table-wrap">{html_table(table)}</div>'
        f'<p class="footer">{html.escape(footer(name, table, ctx))}</p></details>'
    )


def render_html(tables: dict[str, pd.DataFrame], ctx: ReportContext, drill_items: int = DEFAULT_DRILL_ITEMS) -> str:
    baseline = ctx.meta.get("baseline")
    parts = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>formtax report</title>",
        f"<style>{_STYLE}{DRILL_STYLE}</style></head><body>",
        "<h1>formtax report</h1>",
        '<p><a href="#findings">Findings</a> · <a href="#summary">Summary</a> · <a href="#figures">Figures</a> · '
        '<a href="#tables">Detailed tables</a> · <a href="#items">Items</a> · <a href="#run">Run</a></p>',
        '<h2 id="findings">Findings</h2><ul class="findings">',
    ]
    table = tables.get(FINDINGS)
    several = table is not None and table["task"].nunique() > 1
    for r in table.itertuples(index=False) if table is not None else ():
        task = f"<b>{html.escape(str(r.task))}</b>: " if several else ""
        parts.append(f"<li>{task}{html.escape(str(r.sentence))}</li>")
    parts.append("</ul>")
    if baseline:
        parts.append(f"<p>Comparisons are against the baseline <code>{html.escape(str(baseline))}</code>.</p>")
    parts += ['<h2 id="summary">Summary</h2>', f"<p>{html.escape(_description(HEADLINE))}</p>"]
    for task, rows in headline_parts(tables):
        parts += [f"<h3>{html.escape(task)}</h3>", f'<div class="table-wrap">{html_table(rows)}</div>']
    if HEADLINE in tables:
        parts.append(f'<p class="footer">{html.escape(footer(HEADLINE, tables[HEADLINE], ctx))}</p>')
    parts.append('<h2 id="figures">Figures</h2>')
    for stem, caption in _captions(tables).items():
        if stem in ctx.figures:
            data = base64.b64encode(ctx.figures[stem].read_bytes()).decode("ascii")
            parts += [
                f'<figure><img alt="{html.escape(stem)}" src="data:image/png;base64,{data}">',
                f"<figcaption>{html.escape(caption)}</figcaption></figure>",
            ]
    shown, empty = split_tables(tables, baseline)
    parts.append('<h2 id="tables">Detailed tables</h2>')
    parts.append(f"<p>Numbers show 4 significant digits; tables/*.csv hold every value rounded to {DECIMALS} "
                 "decimals.</p>")
    if empty:
        parts.append(f"<p>Empty for this run (not shown): {html.escape(', '.join(empty))}.</p>")
    parts += [_html_section(name, table, ctx) for name, table in shown.items()]
    parts.append(drilldown_html(ctx.df, drill_items))
    parts.append('<h2 id="run">Run configuration and provenance</h2><details><summary>run</summary><ul>')
    parts += [f"<li><b>{html.escape(label)}</b>: {html.escape(value)}</li>" for label, value in manifest_lines(ctx)]
    parts.append("</ul></details>")
    parts.append("</body></html>")
    return "\n".join(parts)
