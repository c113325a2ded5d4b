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

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from formtax.constraints.template import choice_slot
from formtax.errors import ConfigError
from formtax.parsing.result import NO_ANSWER, ParseResult
from formtax.studies.abstention.data import (
    ABSTAIN_KIND,
    BASE_LANGUAGE,
    DEFAULT_PAIRS,
    N_ROWS,
    PAIRS,
    SUBTASK3,
    TEMPLATE,
    TOOL,
    TOOL_DESCRIPTIONS,
    Pair,
    Template,
    build_prompt,
    check_item_gold,
    item_id,
    load_pairs,
    parse_item_id,
    read_exclusions,
    read_translations,
    sample_positions,
    translate_prompt,
)
from formtax.studies.abstention.scoring import ABSTAIN, Category, score_output
from formtax.tasks.base import AnswerKind, ConstraintLevel, Item, OutputFormat, Task
from formtax.tasks.registry import register_task


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
