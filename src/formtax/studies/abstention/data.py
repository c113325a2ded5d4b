"""MetaTool Task 2's data for the tool-abstention study (paper 002): item ids, the prompt template, the
(tool, abstain) pairs read and checked from the benchmark's files, translations and exclusions, and the seeded
sample of positions. :class:`~formtax.studies.abstention.task.MetatoolTask` builds its items from these.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from formtax.errors import ConfigError, DataError
from formtax.studies.abstention.scoring import ABSTAIN
from formtax.tasks.base import Item
from formtax.tasks.io import read_json

N_ROWS = 995


N_CANDIDATES = 10


N_SHOTS = 5


DEFAULT_PAIRS = 200


BASE_LANGUAGE = "en"


TOOL, ABSTAIN_KIND = "tool", "abstain"


SUBTASK3 = "Task2-Subtask3.json"


PAIRS = "task2_pairs.jsonl"


TEMPLATE = "prompt_template/Action_prompt_single_tool"


TOOL_DESCRIPTIONS = "tools/plugin_des.json"


_TOOL_LINE = re.compile(r"(\d+)\. tool name: (.*?), tool description: (.*)")


_LIST_END = "\n[List of Tools with Names and Descriptions End]"


_ID = re.compile(r"(\d{3})-(tool|abstain)(?:-([a-z][a-z0-9_]*))?")


_LANGUAGE = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class ItemKey:
    """What an item id encodes."""

    position: int
    kind: str  # "tool" or "abstain"
    language: str


def item_id(position: int, kind: str, language: str = BASE_LANGUAGE) -> str:
    base = f"{position:03d}-{kind}"
    return base if language == BASE_LANGUAGE else f"{base}-{language}"


def parse_item_id(value: str) -> ItemKey:
    """Invert :func:`item_id`; DataError for an id this task does not make."""
    m = _ID.fullmatch(value)
    if m is None:
        raise DataError(
            f"metatool: {value!r} is not a metatool item id (expected PPP-tool or PPP-abstain[-lang])"
        )
    return ItemKey(int(m.group(1)), m.group(2), m.group(3) or BASE_LANGUAGE)


@dataclass(frozen=True)
class Template:
    """The single-tool template split at its two placeholders."""

    head: str
    middle: str
    tail: str

    @classmethod
    def parse(cls, text: str, where: str) -> Template:
        if text.count("{user_query}") != 1 or text.count("{tool_list}") != 1:
            raise DataError(f"metatool: {where}: expected exactly one {{user_query}} and one {{tool_list}}")
        head, rest = text.split("{user_query}")
        if "{tool_list}" not in rest:
            raise DataError(f"metatool: {where}: {{tool_list}} must come after {{user_query}}")
        middle, tail = rest.split("{tool_list}")
        return cls(head, middle, tail)

    def body(self, query: str, tools: Sequence[tuple[str, str]]) -> str:
        tool_list = "".join(
            f"{k}. tool name: {n}, tool description: {d}\n" for k, (n, d) in enumerate(tools, 1)
        )
        return self.head + query + self.middle + tool_list + self.tail


@dataclass(frozen=True)
class Pair:
    """One checked position: both items' candidates (name, description) and the abstention item's shots."""

    position: int
    query: str
    tool_gold: str
    tool_candidates: tuple[tuple[str, str], ...]
    abstain_candidates: tuple[tuple[str, str], ...]
    shots: tuple[tuple[str, str], ...]  # (query, tool) few-shot lines of the abstention prompt
    source_tool: str  # the abstention file's ``tool`` field: the REMOVED tool, never a gold label


def build_prompt(
    template: Template, query: str, tools: Sequence[tuple[str, str]], shots: Sequence[tuple[str, str]] = ()
) -> str:
    """The benchmark prompt: template body, the few-shot block when there are shots, the completion line."""
    text = template.body(query, tools)
    if shots:
        text += "\nHere are some examples:\n[Examples Start]\n"
        text += "\n".join(f'query: "{q}" tool: {t}' for q, t in shots)
    return text + f'\nUser query: "{query}" tool: '


def translate_prompt(prompt: str, query: str, translated: str, rebuilt: str) -> str:
    """Check that ``rebuilt`` (the prompt built around ``translated``) is ``prompt`` with both occurrences of
    ``query`` replaced and every other byte unchanged; return it. DataError naming the first differing byte.
    """
    parts = prompt.split(query)
    if len(parts) != 3:
        raise DataError(
            f"metatool: the query occurs {len(parts) - 1} times in its prompt, expected 2: {query!r}"
        )
    expected = translated.join(parts)
    if rebuilt != expected:
        at = first_difference(rebuilt, expected)
        raise DataError(
            f"metatool: the translated prompt differs from the original outside the query at character {at}: "
            f"{rebuilt[max(0, at - 20) : at + 20]!r} vs {expected[max(0, at - 20) : at + 20]!r}"
        )
    return rebuilt


def check_item_gold(item: Item) -> None:
    """Refuse an item whose gold contradicts its kind. An abstention item's gold is ``None``, always.

    Taking the abstention file's ``tool`` field as the label would invert the measurement (that tool is
    exactly the one removed from the list), so that case gets its own message.
    """
    kind, source = item.meta.get("kind"), item.meta.get("source_tool")
    names = [name for name, _ in item.choices]
    if kind == ABSTAIN_KIND:
        if item.gold == source:
            raise DataError(
                f"metatool: item {item.id}: the gold label {item.gold!r} is the abstention file's 'tool' "
                "field, which names the tool REMOVED from the candidates; the gold of an abstention item is "
                f"{ABSTAIN!r}"
            )
        if item.gold != ABSTAIN:
            raise DataError(
                f"metatool: item {item.id}: an abstention item's gold must be {ABSTAIN!r}, got {item.gold!r}"
            )
        if source in names:
            raise DataError(f"metatool: item {item.id}: the removed tool {source!r} is among the candidates")
    elif kind == TOOL:
        if not names or item.gold != names[0]:
            raise DataError(
                f"metatool: item {item.id}: the gold tool {item.gold!r} is not the first candidate"
            )
    else:
        raise DataError(f"metatool: item {item.id}: unknown kind {kind!r}")


def first_difference(a: str, b: str) -> int:
    """The first character index where two texts differ (the shorter length when one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def read_json_file(path: Path, what: str) -> Any:
    return read_json("metatool", path, what)


def read_pairs(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise DataError(f"metatool: {path}: file not found; expected {N_ROWS} JSON lines (the paired rows)")
    rows: list[dict[str, Any]] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"metatool: {path} line {n}: not valid JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise DataError(f"metatool: {path} line {n}: not a JSON object")
        rows.append(obj)
    return rows


def row_field(row: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = row.get(key)
    if not isinstance(value, kind):
        raise DataError(f"{where}: field {key!r} is missing or not a {kind.__name__}")
    return value


def tool_list(prompt: str, template: Template, query: str, where: str) -> tuple[tuple[str, str], ...]:
    """The (name, description) lines of a prompt's tool list, checked against the template around them."""
    start = template.head + query + template.middle
    if not prompt.startswith(start):
        raise DataError(
            f"{where}: the prompt does not start with the single-tool template filled with the query"
        )
    end = prompt.find(_LIST_END, len(start))
    if end < 0:
        raise DataError(f"{where}: the prompt has no end of the tool list")
    lines = prompt[len(start) : end].split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    tools: list[tuple[str, str]] = []
    for k, line in enumerate(lines, 1):
        m = _TOOL_LINE.fullmatch(line)
        if m is None or int(m.group(1)) != k:
            raise DataError(
                f"{where}: tool line {k} is not 'N. tool name: X, tool description: Y': {line[:80]!r}"
            )
        tools.append((m.group(2), m.group(3)))
    if len(tools) != N_CANDIDATES:
        raise DataError(f"{where}: {len(tools)} candidate tools, expected {N_CANDIDATES}")
    return tuple(tools)


def check_names(names: Sequence[str], known: set[str], where: str) -> None:
    if len(set(names)) != len(names):
        raise DataError(f"{where}: duplicate candidates {list(names)}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise DataError(f"{where}: candidates {unknown} are not tools of {TOOL_DESCRIPTIONS}")
    bad = [n for n in names if "|" in n or n == ABSTAIN or n != n.strip() or not n]
    if bad:
        raise DataError(f"{where}: candidate names {bad} cannot be used in a choice grammar")


def load_pairs(data_dir: Path) -> tuple[Template, list[Pair]]:
    """Read and check every file: the template and one :class:`Pair` per position.

    Every failure is a DataError naming the file, the row and what was expected (row counts, ten candidates,
    gold first, the rebuilt prompt)."""
    root = data_dir / "metatool"
    template_path = root / TEMPLATE
    if not template_path.is_file():
        raise DataError(
            f"metatool: {template_path}: file not found; expected the single-tool prompt template"
        )
    template = Template.parse(template_path.read_text(encoding="utf-8"), str(template_path))
    known = read_json_file(root / TOOL_DESCRIPTIONS, "a JSON object tool name -> description")
    if not isinstance(known, dict) or len(known) != 199:
        raise DataError(f"metatool: {root / TOOL_DESCRIPTIONS}: expected an object of 199 tools")
    tools_known = set(known)
    s3_path, pairs_path = root / SUBTASK3, root / PAIRS
    s3 = read_json_file(s3_path, f"a JSON array of {N_ROWS} abstention rows")
    if not isinstance(s3, list) or len(s3) != N_ROWS:
        got = len(s3) if isinstance(s3, list) else type(s3).__name__
        raise DataError(f"metatool: {s3_path}: expected a JSON array of {N_ROWS} rows, got {got}")
    paired = read_pairs(pairs_path)
    if len(paired) != N_ROWS:
        raise DataError(f"metatool: {pairs_path}: expected {N_ROWS} rows, got {len(paired)}")
    descriptions: dict[str, str] = {}
    out: list[Pair] = []
    for i, (raw, pr) in enumerate(zip(s3, paired, strict=True)):
        w3, wp = f"metatool: {s3_path} row {i}", f"metatool: {pairs_path} row {i}"
        if not isinstance(raw, dict):
            raise DataError(f"{w3}: not a JSON object")
        query = row_field(raw, "query", str, w3)
        source_tool = row_field(raw, "tool", str, w3)
        action_prompt = row_field(raw, "action_prompt", str, w3)
        if pr.get("row") != i:
            raise DataError(
                f"{wp}: field 'row' is {pr.get('row')!r}, expected {i} (rows are paired by position)"
            )
        if row_field(pr, "query", str, wp) != query:
            raise DataError(
                f"{wp}: the query differs from {SUBTASK3} row {i}; the files are paired by position"
            )
        if row_field(pr, "subtask3_gold", str, wp) != ABSTAIN:
            raise DataError(f"{wp}: 'subtask3_gold' must be {ABSTAIN!r}")
        gold = row_field(pr, "subtask1_gold", str, wp)
        tool_names = row_field(pr, "subtask1_candidates", list, wp)
        abst_names = row_field(pr, "subtask3_candidates", list, wp)
        for what, names in (("subtask1_candidates", tool_names), ("subtask3_candidates", abst_names)):
            if len(names) != N_CANDIDATES or not all(isinstance(n, str) for n in names):
                raise DataError(f"{wp}: '{what}' must list {N_CANDIDATES} tool names, got {len(names)}")
            check_names(names, tools_known, f"{wp} '{what}'")
        if tool_names[0] != gold:
            raise DataError(f"{wp}: the gold tool {gold!r} is not the first of 'subtask1_candidates'")
        if gold != source_tool or pr.get("query_source_tool") != source_tool:
            raise DataError(
                f"{wp}: the tool-needed gold {gold!r} is not the query's source tool {source_tool!r}"
            )
        if source_tool in abst_names:
            raise DataError(
                f"{w3}: the removed tool {source_tool!r} is among the candidates: not an abstention row"
            )
        if set(tool_names) & set(abst_names):
            raise DataError(f"{wp}: the two candidate lists of the pair overlap")
        abst_tools = tool_list(action_prompt, template, query, w3)
        if [n for n, _ in abst_tools] != abst_names:
            raise DataError(f"{wp}: 'subtask3_candidates' differ from the tools of {SUBTASK3} row {i}")
        tool_prompt = row_field(pr, "subtask1_action_prompt_zero_shot_RECONSTRUCTED", str, wp)
        tool_tools = tool_list(tool_prompt, template, query, wp)
        if [n for n, _ in tool_tools] != tool_names:
            raise DataError(f"{wp}: 'subtask1_candidates' differ from the tools in its reconstructed prompt")
        if template.body(query, tool_tools) != tool_prompt:
            raise DataError(
                f"{wp}: the reconstructed tool-needed prompt is not the template filled with its tools"
            )
        for name, desc in abst_tools + tool_tools:
            if descriptions.setdefault(name, desc) != desc:
                raise DataError(f"{w3}: tool {name!r} is described differently from an earlier row")
        raw_shots = row_field(pr, "subtask3_few_shot_examples", list, wp)
        shots = tuple(
            (row_field(s, "query", str, wp), row_field(s, "tool", str, wp))
            for s in raw_shots
            if isinstance(s, dict)
        )
        if len(shots) != N_SHOTS or len(raw_shots) != N_SHOTS:
            raise DataError(f"{wp}: expected {N_SHOTS} few-shot examples, got {len(raw_shots)}")
        rebuilt = build_prompt(template, query, abst_tools, shots)
        if rebuilt != action_prompt:
            at = first_difference(rebuilt, action_prompt)
            raise DataError(
                f"{w3}: the prompt rebuilt from the template, candidates and few-shot examples differs "
                f"from 'action_prompt' at character {at}: {action_prompt[max(0, at - 30) : at + 30]!r}"
            )
        out.append(Pair(i, query, gold, tool_tools, abst_tools, shots, source_tool))
    return template, out


def read_translations(path: Path) -> tuple[str, dict[int, str]]:
    """A translations file: ``{"language": "ko", "queries": {"17": "...", ...}}`` or a bare object mapping
    positions to queries (language ``l2``). Returns (language, position -> query)."""
    data = read_json_file(path, 'a JSON object {"language": ..., "queries": {position: query}}')
    if not isinstance(data, dict):
        raise DataError(f"metatool: {path}: expected a JSON object")
    language, queries = "l2", data
    if "queries" in data:
        language, queries = data.get("language", "l2"), data["queries"]
    if not isinstance(language, str) or not _LANGUAGE.fullmatch(language) or language == BASE_LANGUAGE:
        raise DataError(
            f"metatool: {path}: language must be a lowercase code other than {BASE_LANGUAGE!r}, "
            f"got {language!r}"
        )
    if not isinstance(queries, dict) or not queries:
        raise DataError(f"metatool: {path}: 'queries' must be a non-empty object position -> query")
    out: dict[int, str] = {}
    for key, value in queries.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) < N_ROWS):
            raise DataError(f"metatool: {path}: key {key!r} is not a position 0..{N_ROWS - 1}")
        if not isinstance(value, str) or not value.strip() or "\n" in value:
            raise DataError(f"metatool: {path}: the query at position {key} must be one non-empty line")
        out[int(key)] = value
    return language, out


def read_exclusions(path: Path) -> dict[int, str]:
    """The positions a translations file leaves out, each with its reason (``"excluded": {position: reason}``);
    empty when it excludes none. A position cannot be both translated and excluded."""
    data = read_json_file(path, 'a JSON object {"language": ..., "queries": {...}, "excluded": {position: reason}}')
    raw = data.get("excluded", {}) if isinstance(data, dict) and "queries" in data else {}
    if not isinstance(raw, dict):
        raise DataError(f"metatool: {path}: 'excluded' must be an object position -> reason")
    _, queries = read_translations(path)
    out: dict[int, str] = {}
    for key, reason in raw.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) < N_ROWS):
            raise DataError(f"metatool: {path}: excluded key {key!r} is not a position 0..{N_ROWS - 1}")
        if not isinstance(reason, str) or not reason.strip():
            raise DataError(f"metatool: {path}: the exclusion of position {key} needs a reason")
        if int(key) in queries:
            raise DataError(f"metatool: {path}: position {key} is both translated and excluded")
        out[int(key)] = reason.strip()
    return out


def sample_positions(n_rows: int, pairs: int, seed: int) -> list[int]:
    """``pairs`` positions without replacement: the first ``pairs`` of a fixed-seed permutation, sorted.

    Taking a prefix of one permutation means a larger sample extends a smaller one with the same seed.
    """
    if not 1 <= pairs <= n_rows:
        raise ConfigError(f"metatool: pairs must be between 1 and {n_rows}, got {pairs}")
    order = np.random.default_rng(seed).permutation(n_rows)[:pairs]
    return sorted(int(p) for p in order)
