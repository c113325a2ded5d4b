"""MetaTool Task 2 tool abstention (paper 002): paired tool-needed and abstention items on the same query.

Data (``<data>/metatool/``, see its SOURCE.md): ``Task2-Subtask3.json`` is the original abstention file (995
rows, the correct answer of every row is ``None``), ``task2_pairs.jsonl`` pairs row i of it with the rebuilt
tool-needed row i (same query, gold tool first of ten candidates), and
``prompt_template/Action_prompt_single_tool`` is the benchmark's single-tool template.

Why the design is what it is:

- **Pairs, not rows.** Position i is one pair: a tool-needed item (gold = its listed tool) and an abstention
  item (gold = ``None``). ``pairs`` positions are drawn without replacement by a fixed-seed permutation and
  both halves of each enter the run, so the two item types have matched queries by construction. The
  upstream ``index`` field is 9 in every row and is never read: items are identified by position.
- **The tool field is never a gold label.** In the abstention file ``tool`` names the tool that was removed
  from the candidate list. :func:`check_item_gold` refuses an abstention item whose gold is anything but
  ``None`` (and names the mistake when the gold is that removed tool).
- **One prompt for every condition.** The prompt is the benchmark's own, not formtax's answer-format prompt:
  the template filled with the query and the item's ten candidates, then (abstention items only, as in the
  original file) the row's five few-shot lines, then the completion line ``User query: "<query>" tool: ``.
  The abstention prompt is rebuilt from its parts and must equal the original ``action_prompt`` byte for
  byte, which checks the parser and the files together. The tool-needed prompt is the reconstructed zero-shot
  template (its original few-shot lines are not recoverable) plus the same completion line, so the query
  appears twice in both item types, as in the release. ``free``, ``short`` and ``constrained`` get the
  identical prompt (``same_prompt_all_formats``; the runner refuses otherwise).
- **A second language replaces only the query.** ``translations`` maps a position to a translated query;
  both occurrences are replaced and every other byte is asserted unchanged (:func:`translate_prompt`). A
  translator may leave a position out with a reason (``"excluded": {"17": "idiom has no Korean equivalent"}``,
  :func:`read_exclusions`): that pair is in the run in English only, the exclusions are written to the run's
  manifest (``task_notes``), and the language table compares the languages on the positions both cover.
- **The answer is read by the benchmark's rules** (:mod:`formtax.studies.abstention.scoring`), not by formtax's
  ``The answer is:`` parsers: :meth:`MetatoolTask.parse_output` gives the strict and lenient verdicts (the
  same: there is one deterministic rule).

Item ids are ``PPP-tool`` / ``PPP-abstain`` (PPP = the zero-padded position) and ``PPP-<kind>-<lang>`` for a
translated item; :func:`parse_item_id` inverts them for the report.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from formtax.constraints.template import choice_slot
from formtax.errors import ConfigError, DataError
from formtax.parsing.result import NO_ANSWER, ParseResult
from formtax.studies.abstention.scoring import ABSTAIN, Category, score_output
from formtax.tasks.base import AnswerKind, ConstraintLevel, Item, OutputFormat, Task
from formtax.tasks.io import read_json
from formtax.tasks.registry import register_task

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


# -- loading and checking the files ----------------------------------------------------------------------


def _read_json(path: Path, what: str) -> Any:
    return read_json("metatool", path, what)


def _read_pairs(path: Path) -> list[dict[str, Any]]:
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


def _field(row: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = row.get(key)
    if not isinstance(value, kind):
        raise DataError(f"{where}: field {key!r} is missing or not a {kind.__name__}")
    return value


def _tool_list(prompt: str, template: Template, query: str, where: str) -> tuple[tuple[str, str], ...]:
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


def _check_names(names: Sequence[str], known: set[str], where: str) -> None:
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
    known = _read_json(root / TOOL_DESCRIPTIONS, "a JSON object tool name -> description")
    if not isinstance(known, dict) or len(known) != 199:
        raise DataError(f"metatool: {root / TOOL_DESCRIPTIONS}: expected an object of 199 tools")
    tools_known = set(known)
    s3_path, pairs_path = root / SUBTASK3, root / PAIRS
    s3 = _read_json(s3_path, f"a JSON array of {N_ROWS} abstention rows")
    if not isinstance(s3, list) or len(s3) != N_ROWS:
        got = len(s3) if isinstance(s3, list) else type(s3).__name__
        raise DataError(f"metatool: {s3_path}: expected a JSON array of {N_ROWS} rows, got {got}")
    paired = _read_pairs(pairs_path)
    if len(paired) != N_ROWS:
        raise DataError(f"metatool: {pairs_path}: expected {N_ROWS} rows, got {len(paired)}")
    descriptions: dict[str, str] = {}
    out: list[Pair] = []
    for i, (raw, pr) in enumerate(zip(s3, paired, strict=True)):
        w3, wp = f"metatool: {s3_path} row {i}", f"metatool: {pairs_path} row {i}"
        if not isinstance(raw, dict):
            raise DataError(f"{w3}: not a JSON object")
        query = _field(raw, "query", str, w3)
        source_tool = _field(raw, "tool", str, w3)
        action_prompt = _field(raw, "action_prompt", str, w3)
        if pr.get("row") != i:
            raise DataError(
                f"{wp}: field 'row' is {pr.get('row')!r}, expected {i} (rows are paired by position)"
            )
        if _field(pr, "query", str, wp) != query:
            raise DataError(
                f"{wp}: the query differs from {SUBTASK3} row {i}; the files are paired by position"
            )
        if _field(pr, "subtask3_gold", str, wp) != ABSTAIN:
            raise DataError(f"{wp}: 'subtask3_gold' must be {ABSTAIN!r}")
        gold = _field(pr, "subtask1_gold", str, wp)
        tool_names = _field(pr, "subtask1_candidates", list, wp)
        abst_names = _field(pr, "subtask3_candidates", list, wp)
        for what, names in (("subtask1_candidates", tool_names), ("subtask3_candidates", abst_names)):
            if len(names) != N_CANDIDATES or not all(isinstance(n, str) for n in names):
                raise DataError(f"{wp}: '{what}' must list {N_CANDIDATES} tool names, got {len(names)}")
            _check_names(names, tools_known, f"{wp} '{what}'")
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
        abst_tools = _tool_list(action_prompt, template, query, w3)
        if [n for n, _ in abst_tools] != abst_names:
            raise DataError(f"{wp}: 'subtask3_candidates' differ from the tools of {SUBTASK3} row {i}")
        tool_prompt = _field(pr, "subtask1_action_prompt_zero_shot_RECONSTRUCTED", str, wp)
        tool_tools = _tool_list(tool_prompt, template, query, wp)
        if [n for n, _ in tool_tools] != tool_names:
            raise DataError(f"{wp}: 'subtask1_candidates' differ from the tools in its reconstructed prompt")
        if template.body(query, tool_tools) != tool_prompt:
            raise DataError(
                f"{wp}: the reconstructed tool-needed prompt is not the template filled with its tools"
            )
        for name, desc in abst_tools + tool_tools:
            if descriptions.setdefault(name, desc) != desc:
                raise DataError(f"{w3}: tool {name!r} is described differently from an earlier row")
        raw_shots = _field(pr, "subtask3_few_shot_examples", list, wp)
        shots = tuple(
            (_field(s, "query", str, wp), _field(s, "tool", str, wp))
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
    data = _read_json(path, 'a JSON object {"language": ..., "queries": {position: query}}')
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
    data = _read_json(path, 'a JSON object {"language": ..., "queries": {...}, "excluded": {position: reason}}')
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


@register_task
class MetatoolTask(Task):
    """MetaTool Task 2: pick the applicable tool of ten, or answer ``None`` when none applies."""

    name: ClassVar[str] = "metatool"
    answer_kind: ClassVar[AnswerKind] = AnswerKind.CHOICE
    description: ClassVar[str] = (
        "MetaTool Task 2 tool selection vs abstention: paired items (tool-needed, gold = the tool; "
        "abstention, gold = None), 10 candidates each; options pairs, pair_seed, translations"
    )
    instructions: ClassVar[tuple[str, str, str]] = (
        "",
        "",
        "",
    )  # unused: the benchmark's own template is the prompt
    same_prompt_all_formats: ClassVar[bool] = True
    OPTIONS: ClassVar[tuple[str, ...]] = ("pairs", "pair_seed", "translations")

    def __init__(self) -> None:
        super().__init__()
        self.pairs = DEFAULT_PAIRS
        self.pair_seed = 0
        self.translations: Path | None = None
        self.exclusions: dict[int, str] = {}  # sampled positions the translations leave out, with reasons

    def configure(self, options: Mapping[str, Any]) -> None:
        """Take the task options of a run (``RunConfig.task_options``); unknown names are refused."""
        unknown = sorted(set(options) - set(self.OPTIONS))
        if unknown:
            raise ConfigError(f"metatool: unknown task options {unknown}; known: {', '.join(self.OPTIONS)}")
        for key in ("pairs", "pair_seed"):
            if key in options and (not isinstance(options[key], int) or isinstance(options[key], bool)):
                raise ConfigError(f"metatool: option {key!r} must be an integer, got {options[key]!r}")
        self.pairs = int(options.get("pairs", DEFAULT_PAIRS))
        self.pair_seed = int(options.get("pair_seed", 0))
        sample_positions(
            N_ROWS, self.pairs, self.pair_seed
        )  # validates the size now, before any file is read
        tr = options.get("translations")
        self.translations = Path(tr) if tr else None

    def notes(self) -> dict[str, Any]:
        """What the run's manifest records about the loaded items beyond their ids: the translation exclusions."""
        if not self.exclusions:
            return {}
        return {"translation_exclusions": {f"{p:03d}": reason for p, reason in sorted(self.exclusions.items())}}

    def data_files(self, data_dir: Path) -> list[Path]:
        root = data_dir / "metatool"
        files = [root / SUBTASK3, root / PAIRS, root / TEMPLATE, root / TOOL_DESCRIPTIONS]
        return files + ([self.translations] if self.translations is not None else [])

    def _load(self, data_dir: Path | None) -> list[Item]:
        root = self._require_dir(data_dir)
        template, all_pairs = load_pairs(root)
        positions = sample_positions(len(all_pairs), self.pairs, self.pair_seed)
        items: list[Item] = []
        for pos in positions:
            items += self._pair_items(template, all_pairs[pos], all_pairs[pos].query, BASE_LANGUAGE)
        if self.translations is not None:
            language, queries = read_translations(self.translations)
            excluded = read_exclusions(self.translations)
            missing = [p for p in positions if p not in queries and p not in excluded]
            if missing:
                raise ConfigError(
                    f"metatool: {self.translations} has no translation for {len(missing)} sampled "
                    f"positions (e.g. {missing[:10]}); every sampled pair needs one, or an exclusion with a reason"
                )
            self.exclusions = {p: excluded[p] for p in positions if p in excluded}
            english = {it.id: str(it.meta["prompt"]) for it in items}
            for pos in (p for p in positions if p in queries):
                pair = all_pairs[pos]
                for it in self._pair_items(template, pair, queries[pos], language):
                    key = parse_item_id(it.id)
                    translate_prompt(
                        english[item_id(pos, key.kind)], pair.query, queries[pos], str(it.meta["prompt"])
                    )
                    items.append(it)
        for it in items:
            check_item_gold(it)
        return items

    @staticmethod
    def _pair_items(template: Template, pair: Pair, query: str, language: str) -> list[Item]:
        common = {"position": pair.position, "language": language, "source_tool": pair.source_tool}
        tool = Item(
            id=item_id(pair.position, TOOL, language),
            question=query,
            gold=pair.tool_gold,
            choices=pair.tool_candidates,
            meta={**common, "kind": TOOL, "prompt": build_prompt(template, query, pair.tool_candidates)},
        )
        abstain = Item(
            id=item_id(pair.position, ABSTAIN_KIND, language),
            question=query,
            gold=ABSTAIN,
            choices=pair.abstain_candidates,
            meta={
                **common,
                "kind": ABSTAIN_KIND,
                "prompt": build_prompt(template, query, pair.abstain_candidates, pair.shots),
            },
        )
        return [tool, abstain]

    # -- prompt and answer space ----------------------------------------------------------------------------

    def messages(
        self,
        item: Item,
        output_format: OutputFormat,
        task_variant: int,
        format_variant: int,
        shots: Sequence[Item],
    ) -> list[dict[str, str]]:
        """The benchmark prompt as one user message, whatever the output format (all conditions share it)."""
        if (task_variant, format_variant) != (1, 1):
            raise ConfigError(
                "metatool has one prompt (the benchmark's template); use --prompt-variants t1f1"
            )
        if shots:
            raise ConfigError("metatool takes no formtax shots (the abstention prompts carry their own)")
        return [{"role": "user", "content": str(item.meta["prompt"])}]

    def shots(self, n: int, seed: int, exclude_ids: set[str]) -> list[Item]:
        if n:
            raise ConfigError(
                "metatool takes no formtax shots (the abstention prompts carry their own); use --shots 0"
            )
        return []

    @staticmethod
    def candidates(item: Item) -> list[str]:
        return [name for name, _ in item.choices]

    def answer_spec(self, level: ConstraintLevel, item: Item, output_format: OutputFormat) -> str:
        """VC: a choice over the item's ten candidate names plus ``None`` (one line, nothing else).
        FC: any one line of text (the format only)."""
        return (
            self.answer_slot(level, item)
            if level == "fc"
            else "choice:" + "|".join([*self.candidates(item), ABSTAIN])
        )

    def _vc_slot(self, item: Item) -> str:
        return choice_slot([*self.candidates(item), ABSTAIN])

    def answer_description(self, item: Item) -> str:
        return "the name of one of the listed tools, or None"

    def normalize(self, value: str) -> str | None:
        return value.strip() or None

    def parse_output(self, text: str, item: Item, output_format: OutputFormat) -> dict[str, ParseResult]:
        """The benchmark's reading of an output (strict and lenient alike): ``ok`` with the decision,
        ``no_answer`` for D0, ``invalid`` (raw = the names) for D2."""
        s = score_output(text, self.candidates(item), item.gold)
        if s.category is Category.D0:
            result = NO_ANSWER
        elif s.category is Category.D2:
            result = ParseResult("invalid", None, "|".join(s.named))
        else:
            result = ParseResult("ok", s.decision, s.decision)
        return {"strict": result, "lenient": result}
