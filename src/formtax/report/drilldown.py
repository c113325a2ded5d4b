"""The per-item drill-down of ``report.html``: every item's prompt, each strategy's output with its phases, the
parse under each parser, gold, correct or not, finish reason and tokens, with filters.

Everything is rendered here, in Python, with :func:`html.escape` on every model output, prompt and parse; the
page's script only shows and hides elements by their ``data-*`` attributes (it never builds HTML from record
text), so no output can inject markup. The script is ours and inline (the report is one self-contained file).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pandas as pd

from formtax.records.schema import Record

DEFAULT_DRILL_ITEMS = 500
"""Items shown in the drill-down by default (the rest are in records.jsonl); ``formtax report --drill-items``."""


class Outcome(StrEnum):
    """What became of one output under the strict parser (the drill-down's filter)."""

    CORRECT = "correct"
    WRONG = "wrong"
    UNPARSED = "unparsed"
    ERROR = "error"


def outcome(row: pd.Series) -> Outcome:
    """A record's outcome: error (unscored), unparsed (strict parse not ok), correct or wrong (strict score)."""
    if not bool(row["scored"]):
        return Outcome.ERROR
    if row["parse_status_strict"] != "ok":
        return Outcome.UNPARSED
    return Outcome.CORRECT if float(row["score_strict"]) == 1.0 else Outcome.WRONG


@dataclass(frozen=True)
class _Item:
    task: str
    item_id: str
    rows: pd.DataFrame

    @property
    def disagree(self) -> bool:
        """Strategies disagree on this item: one output is correct and another is not (strict)."""
        outcomes = {outcome(r) for _, r in self.rows.iterrows()}
        return Outcome.CORRECT in outcomes and len(outcomes) > 1


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _phases_html(rec: Record) -> str:
    """The output with each phase in its own span (class ``ph ph-<phase>``); the whole text when the record has
    no phases or its phases do not spell the text."""
    phases = rec.phases or {}
    if phases and "".join(phases.values()) == rec.text:
        return "".join(
            f'<span class="ph ph-{_e(name)}" title="{_e(name)}">{_e(text)}</span>' for name, text in phases.items()
        )
    body = f'<span class="ph ph-text" title="text">{_e(rec.text)}</span>'
    if rec.answer_text is not None and rec.answer_text not in rec.text:
        body += f'<span class="ph ph-answer" title="answer">{_e(rec.answer_text)}</span>'
    return body


def _parse_cells(rec: Record) -> str:
    cells = []
    for parser in ("strict", "lenient"):
        parse = rec.parses.get(parser)
        if parse is None:
            cells.append(f"<td>{parser}: -</td>")
            continue
        value = "" if parse.value is None else f" = {parse.value}"
        score = rec.scores.get(parser)
        mark = "" if score is None else (" (correct)" if score else " (wrong)")
        cells.append(f'<td class="parse">{parser}: {_e(parse.status)}{_e(value)}{mark}</td>')
    return "".join(cells)


def _output_html(row: pd.Series) -> str:
    rec: Record = row["record"]
    tokens = rec.tokens.get("total", "")
    result = outcome(row)
    head = (
        f'<table class="out-head"><tr><td class="strategy">{_e(rec.strategy)}</td>'
        f"<td>variant {_e(rec.prompt_variant)} / seed {_e(rec.seed)}</td>"
        f'<td class="outcome">{result.value}</td>{_parse_cells(rec)}'
        f"<td>finish: {_e(rec.finish_reason)}</td><td>tokens: {_e(tokens)}</td></tr></table>"
    )
    error = f'<p class="error">error: {_e(rec.error)}</p>' if rec.error else ""
    return (
        f'<div class="out" data-strategy="{_e(rec.strategy)}" data-outcome="{result.value}">{head}{error}'
        f'<pre class="text">{_phases_html(rec)}</pre></div>'
    )


def _item_html(item: _Item) -> str:
    rows = item.rows.sort_values(["strategy", "prompt_variant", "seed"], kind="stable")
    first: Record = rows.iloc[0]["record"]
    prompts = {r.prompt for r in rows["record"]}
    prompt_note = "" if len(prompts) == 1 else f" ({len(prompts)} distinct prompts; the first shown)"
    outs = "".join(_output_html(r) for _, r in rows.iterrows())
    return (
        f'<section class="item" data-task="{_e(item.task)}" data-item="{_e(item.item_id)}" '
        f'data-disagree="{int(item.disagree)}">'
        f"<h3>{_e(item.task)} / item {_e(item.item_id)} <span class=\"gold\">gold: {_e(first.gold)}</span></h3>"
        f"<details><summary>prompt{_e(prompt_note)}</summary><pre class=\"prompt\">{_e(first.prompt)}</pre>"
        f"</details>{outs}</section>"
    )


_SCRIPT = """
(function () {
  var strat = document.getElementById('f-strategy');
  var outc = document.getElementById('f-outcome');
  var dis = document.getElementById('f-disagree');
  var count = document.getElementById('f-count');
  function apply() {
    var shown = 0, outsShown = 0;
    document.querySelectorAll('#drill .item').forEach(function (item) {
      var any = false;
      item.querySelectorAll('.out').forEach(function (out) {
        var ok = (strat.value === '' || out.dataset.strategy === strat.value) &&
                 (outc.value === '' || out.dataset.outcome === outc.value);
        out.hidden = !ok;
        if (ok) { any = true; outsShown++; }
      });
      var visible = any && (!dis.checked || item.dataset.disagree === '1');
      item.hidden = !visible;
      if (visible) { shown++; }
    });
    count.textContent = shown + ' items, ' + outsShown + ' outputs shown';
  }
  [strat, outc, dis].forEach(function (el) { el.addEventListener('change', apply); });
  apply();
})();
"""

STYLE = (
    "#drill .item{border-top:2px solid #888;margin-top:1em;} #drill pre{white-space:pre-wrap;margin:0.2em 0;"
    "background:#fafafa;border:1px solid #ddd;padding:4px;} #drill .out{margin:0.5em 0 0.5em 1em;}"
    ".out-head{max-width:100%;} .out-head td{border:none;text-align:left;padding:0 8px 0 0;overflow-wrap:anywhere;}"
    "#drill pre{overflow-wrap:anywhere;} #drill .out{min-width:0;} .ph-reasoning,.ph-rc,.ph-text{color:#333;}"
    ".ph-answer,.ph-json{background:#fff2a8;font-weight:bold;} .out[data-outcome=correct] .outcome{color:#080;}"
    ".out[data-outcome=wrong] .outcome{color:#b00;} .out[data-outcome=unparsed] .outcome{color:#a60;}"
    ".out[data-outcome=error] .outcome{color:#b00;font-weight:bold;} .gold{font-weight:normal;color:#555;}"
    ".filters{position:sticky;top:0;background:#fff;padding:4px 0;border-bottom:1px solid #ccc;}"
)


def drilldown_html(df: pd.DataFrame, limit: int = DEFAULT_DRILL_ITEMS) -> str:
    """The drill-down section of ``report.html`` for the records of ``df`` (at most ``limit`` items, in task then
    item order; ``limit <= 0``: none)."""
    if limit <= 0 or df.empty:
        return ""
    groups = [_Item(str(t), str(i), rows) for (t, i), rows in df.groupby(["task", "item_id"], sort=True)]
    total = len(groups)
    groups = sorted(groups, key=lambda g: (g.task, _natural(g.item_id)))[:limit]
    strategies = sorted({str(s) for s in df["strategy"]})
    options = "".join(f'<option value="{_e(s)}">{_e(s)}</option>' for s in strategies)
    outcomes = "".join(f'<option value="{o.value}">{o.value}</option>' for o in Outcome)
    note = "" if total <= limit else f" (the first {limit} of {total} items; every record is in records.jsonl)"
    filters = (
        '<div class="filters">strategy <select id="f-strategy"><option value="">all</option>'
        f'{options}</select> outcome (strict) <select id="f-outcome"><option value="">all</option>{outcomes}'
        '</select> <label><input type="checkbox" id="f-disagree"> only items where strategies disagree</label> '
        '<span id="f-count"></span></div>'
    )
    body = "".join(_item_html(g) for g in groups)
    return (
        f'<h2 id="items">Items</h2><p>Every output of every item{_e(note)}: the prompt, each strategy\'s text '
        "(the answer phase highlighted), the parse under each parser, gold, finish reason and tokens.</p>"
        f'<div id="drill">{filters}{body}</div><script>{_SCRIPT}</script>'
    )


def _natural(item_id: str) -> tuple[int, int, str]:
    """Integer item ids in numeric order, others after them in text order."""
    try:
        return (0, int(item_id), item_id)
    except ValueError:
        return (1, 0, item_id)
