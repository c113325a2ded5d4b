"""Reading an output into per-parser verdicts and scores, once: the run does it as it records (``make_record``), and
``formtax verify`` does it again from every record's text (issue 60: a hand-set ``scores.strict`` or a parse that the
parsers no longer give is caught, so verify recomputes every number, not only the tables from the stored verdicts).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from formtax.errors import FormtaxError
from formtax.parsing import ParseResult, parse_all
from formtax.records.schema import Record
from formtax.runner.config import ConfigurableTask, OwnParsing
from formtax.runner.grid import parse_strategy_spec
from formtax.scoring import score_all
from formtax.tasks import Item, OutputFormat, Task, get_task
from formtax.tasks.base import resolve_data_dir
from formtax.tasks.vocab import ANSWER_ALONE

log = logging.getLogger(__name__)


def read_output(task: Task, item: Item, text: str, answer_text: str | None, output_format: str, answer_alone: bool,
                constraint_ignored: bool) -> tuple[dict[str, ParseResult], dict[str, bool]]:
    """The verdicts and scores of one output: what the strategy presents as its answer (the constrained part when
    there is one) read in the record's format; a second call's whole output is the answer (paper 003); an output
    whose engine broke the constraint is never scored as parsed."""
    read = answer_text if answer_text is not None else text
    fmt = OutputFormat(output_format)
    if answer_alone and answer_text is not None:
        fmt = ANSWER_ALONE.get(fmt, fmt)
    parses = task.parse_output(read, item, fmt) if isinstance(task, OwnParsing) else parse_all(read, task, item, fmt)
    if constraint_ignored:
        parses = {k: ParseResult("invalid", None, v.raw) for k, v in parses.items()}
    return parses, score_all(task, item, parses)


def _task_for(name: str, config: Mapping[str, Any]) -> Task:
    task = get_task(name)
    if isinstance(task, ConfigurableTask):
        options = config.get("task_options") or {} if config.get("task") == name else {}
        replacement = task.configure(options)
        if isinstance(replacement, Task):
            task = replacement
    return task


def _items(task: Task, config: Mapping[str, Any]) -> dict[str, Item]:
    try:
        data_dir = config.get("data_dir")
        needs = task._needs_data() and bool(task.data_files(Path(".")))
        return {it.id: it for it in task.load(resolve_data_dir(Path(data_dir) if data_dir else None) if needs
                                               else None)}
    except (FormtaxError, OSError) as e:  # no data here: its records are left to the tables
        log.info("records of %s are not re-parsed: its data is not here (%s)", task.name, e)
        return {}


def reparse_problems(records: Sequence[Record], manifest: Mapping[str, Any] | None) -> list[str]:
    """Every record whose stored parses or scores differ from what its text reads now, as one line each. Records
    whose item cannot be rebuilt here (a pooled label, a task module not imported, data not on this machine, an item
    whose gold differs from the data's) are left to the tables; the reparse never guesses an item."""
    config = (manifest or {}).get("config") or {}
    tasks: dict[str, tuple[Task, dict[str, Item]] | None] = {}
    problems: list[str] = []
    for n, rec in enumerate(records, start=1):
        if rec.error is not None or rec.text is None:
            continue
        if rec.task not in tasks:
            try:
                task = _task_for(rec.task, config)
                tasks[rec.task] = (task, _items(task, config))
            except FormtaxError as e:
                log.info("records of task %r are not re-parsed: %s", rec.task, e)
                tasks[rec.task] = None
        built = tasks[rec.task]
        if built is None:
            continue
        task, items = built
        item = items.get(rec.item_id)
        if item is None or item.gold != rec.gold:  # not this machine's item (no data here, or other data)
            continue
        try:
            alone = parse_strategy_spec(rec.strategy).strategy.answer_alone
            parses, scores = read_output(task, item, rec.text, rec.answer_text, rec.output_format, alone,
                                         bool((rec.stats or {}).get("constraint_ignored")))
        except (FormtaxError, KeyError, ValueError) as e:  # a record this formtax cannot read again: the tables
            log.info("record %d (%s) is not re-parsed: %s", n, rec.request_id, e)
            continue
        where = f"records.jsonl record {n} (request {rec.request_id})"
        for name, got in parses.items():
            stored = rec.parses.get(name)
            if stored is None or (stored.status, stored.value) != (got.status, got.value):
                was = "missing" if stored is None else f"{stored.status} {stored.value}"
                problems.append(f"{where}: its {name} parse is {was} but its text reads {got.status} {got.value}")
        for name, ok in scores.items():
            if rec.scores.get(name) != ok:
                problems.append(f"{where}: its {name} score is {rec.scores.get(name)} but its text scores {ok}")
    return problems
