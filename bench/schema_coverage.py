"""JSON Schema coverage: the official JSON-Schema-Test-Suite (draft 2020-12) through formtax's constraint path (issue 36).

    python bench/schema_coverage.py              # a table per keyword file, then one JSON line
    python bench/schema_coverage.py --details    # also every schema that is refused, with the engine's reason

Every schema of the vendored suite (``tests/fixtures/json-schema-test-suite``, MIT) is compiled the way
``answer=<schema>`` compiles it (:class:`~formtax.constraints.spec.JsonConstraint`): exactly, as a flagged
approximation (``oneOf`` as ``anyOf``, an unknown ``format`` as a string, an unimplemented keyword left to the
oracle), or refused with the engine's reason. Every instance of a compiled schema is then written as formtax's
grammar lays JSON out (``json.dumps``' separators) and
- run through the grammar engine (the byte tokenizer: does the grammar admit it?), and
- *parsed* as formtax parses an answer: the grammar admits it and the ``jsonschema`` oracle, on the schema as given,
  validates it.

Against the suite's own ``valid`` flags: an invalid instance reported as parsed is the failure that must never
happen (``invalid_parsed``, target 0); a valid one the grammar refuses is coverage lost (``valid_refused``).
``ratio``: the share of schemas compiled (exactly or approximated).

Format assertion: the suite's ``optional/format`` tests (vendored beside it) run the same way with the oracle's format
checker on (formtax's default: :func:`~formtax.constraints.spec.schema_validator`), so an invalid date, email, URI
template, ... must come back unparsed (``format_invalid_parsed``, target 0). Their table adds ``unchecked``: schemas
with a format neither the grammar nor the oracle checks (named in ``Result.stats["formats_unchecked"]``). In the
required suite's ``format.json`` the suite counts a wrong format as valid (annotation only), so format assertion
refuses those instances there: counted in ``valid_refused``, on purpose.

``--jsonschemabench DIR`` also compiles every schema of a JSONSchemaBench checkout's ``data`` folder (real-world
schemas from GitHub, Kubernetes, JSON Schema Store, ...; not vendored: pass the folder) and reports, per source, the
share compiled exactly, approximated and refused (target: at least 95% compiled).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import finish

from formtax.constraints.compile import validate_with_engine
from formtax.constraints.spec import JsonConstraint
from formtax.errors import ConstraintError

SUITE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "json-schema-test-suite" / "draft2020-12"
FORMATS = SUITE / "optional" / "format"


@dataclass
class Tally:
    exact: int = 0
    approximated: int = 0
    refused: int = 0
    valid_parsed: int = 0
    valid_refused: int = 0  # the grammar (or the oracle) refused a valid instance
    invalid_parsed: int = 0  # must stay 0
    invalid_rejected: int = 0
    grammar_admits_invalid: int = 0  # the grammar admitted an invalid instance; the oracle caught it
    unchecked: int = 0  # compiled schemas with a format that neither the grammar nor the oracle checks
    reasons: Counter[str] = field(default_factory=Counter)
    approximations: Counter[str] = field(default_factory=Counter)
    refused_schemas: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        for k in ("exact", "approximated", "refused", "valid_parsed", "valid_refused", "invalid_parsed",
                  "invalid_rejected", "grammar_admits_invalid", "unchecked"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        self.reasons.update(other.reasons)
        self.approximations.update(other.approximations)
        self.refused_schemas.extend(other.refused_schemas)

    @property
    def schemas(self) -> int:
        return self.exact + self.approximated + self.refused


def _reason(error: str) -> str:
    """A refusal's reason, short enough to count."""
    first = error.split(": ", 1)[-1].splitlines()[0]
    if "not present in a registry" in first or "retriev" in first:
        return "a remote $ref (nothing is fetched)"
    return first[:80]


def run_group(group: dict[str, Any], where: str) -> Tally:
    """One schema of the suite and its instances (module docstring)."""
    t = Tally()
    schema = group["schema"]
    try:
        if not isinstance(schema, dict):
            raise ConstraintError(f"a boolean schema ({json.dumps(schema)}) is not an answer constraint")
        c = JsonConstraint(schema)
        grammar = c.grammar
    except ConstraintError as e:
        t.refused += 1
        t.reasons[_reason(str(e))] += 1
        t.refused_schemas.append(f"{where}: {_reason(str(e))}")
        return t
    t.unchecked += int(bool(c.unchecked_formats))
    if c.approximations:
        t.approximated += 1
        t.approximations.update(c.approximations)
    else:
        t.exact += 1
    for test in group["tests"]:
        text = json.dumps(test["data"])
        admitted = validate_with_engine(grammar, text)[0]
        parsed = admitted and c.validate(text).ok
        if test["valid"]:
            t.valid_parsed += int(parsed)
            t.valid_refused += int(not parsed)
        else:
            t.invalid_parsed += int(parsed)
            t.invalid_rejected += int(not parsed)
            t.grammar_admits_invalid += int(admitted)
    return t


def run_suite(suite: Path = SUITE) -> dict[str, Tally]:
    """Every file of the suite: its tally, keyed by the file's stem (the keyword it tests)."""
    out: dict[str, Tally] = {}
    for path in sorted(suite.glob("*.json")):
        tally = Tally()
        for k, group in enumerate(json.loads(path.read_text(encoding="utf-8"))):
            tally.add(run_group(group, f"{path.stem}[{k}] {group.get('description', '')}"))
        out[path.stem] = tally
    return out


def compile_only(folder: Path) -> dict[str, Tally]:
    """Every ``*.json`` schema below ``folder``, compiled only (no instances): a tally per sub-folder."""
    out: dict[str, Tally] = {}
    for path in sorted(folder.rglob("*.json")):
        tally = out.setdefault(path.parent.name, Tally())
        try:
            schema = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            tally.refused += 1
            tally.reasons[f"unreadable: {type(e).__name__}"] += 1
            continue
        tally.add(run_group({"schema": schema, "tests": []}, str(path.relative_to(folder))))
    return out


def report_bench(folder: Path) -> dict[str, Any]:
    """The JSONSchemaBench table (module docstring) and its totals."""
    per = compile_only(folder)
    total = Tally()
    print("\n| JSONSchemaBench source | schemas | exact | approximated | refused | compiled |")
    print("|---|---|---|---|---|---|")
    for name, t in [*per.items(), ("**all**", total)]:
        if name != "**all**":
            total.add(t)
        print(f"| {name} | {t.schemas} | {t.exact} | {t.approximated} | {t.refused} | "
              f"{(t.exact + t.approximated) / max(1, t.schemas):.1%} |")
    t = total
    share = (t.exact + t.approximated) / max(1, t.schemas)
    print("JSONSchemaBench approximations:", dict(t.approximations.most_common(12)))
    print("JSONSchemaBench refused, by reason:", dict(t.reasons.most_common(12)))
    return {"jsonschemabench_schemas": t.schemas, "jsonschemabench_exact": t.exact,
            "jsonschemabench_approximated": t.approximated, "jsonschemabench_refused": t.refused,
            "jsonschemabench_compiled": round(share, 4), "jsonschemabench_target": 0.95}


def print_table(first: str, per: dict[str, Tally], unchecked: bool = False) -> Tally:
    """One Markdown table of per-file tallies (``unchecked``: with that column) and their total."""
    total = Tally()
    extra = " unchecked |" if unchecked else ""
    print(f"\n| {first} | schemas | exact | approximated |{extra} refused | valid parsed | valid refused | "
          "invalid rejected | invalid parsed |")
    print("|---" * (9 + unchecked) + "|")
    for name, t in [*per.items(), ("**all**", total)]:
        if name != "**all**":
            total.add(t)
        cell = f" {t.unchecked} |" if unchecked else ""
        print(f"| {name} | {t.schemas} | {t.exact} | {t.approximated} |{cell} {t.refused} | {t.valid_parsed} | "
              f"{t.valid_refused} | {t.invalid_rejected} | {t.invalid_parsed} |")
    return total


def report_formats() -> dict[str, Any]:
    """The ``optional/format`` table, format assertion on (module docstring), and its totals."""
    t = print_table("format (assertion on)", run_suite(FORMATS), unchecked=True)
    return {"format_schemas": t.schemas, "format_exact": t.exact, "format_approximated": t.approximated,
            "format_unchecked": t.unchecked, "format_refused": t.refused, "format_valid_parsed": t.valid_parsed,
            "format_valid_refused": t.valid_refused, "format_invalid_parsed": t.invalid_parsed,
            "format_invalid_rejected": t.invalid_rejected, "format_invalid_parsed_target": 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--details", action="store_true", help="list every refused schema with its reason")
    ap.add_argument("--jsonschemabench", type=Path, default=None, help="a JSONSchemaBench checkout's data folder")
    a = ap.parse_args()
    t = print_table("file", run_suite())
    print("\napproximations:", dict(t.approximations.most_common()))
    print("refused, by reason:", dict(t.reasons.most_common()))
    if a.details:
        print("\n".join(t.refused_schemas))
    compiled = t.exact + t.approximated
    fmt = report_formats()
    bench = report_bench(a.jsonschemabench) if a.jsonschemabench is not None else {}
    finish({**bench, **fmt, "bench": "schema_coverage", "schemas": t.schemas, "exact": t.exact, "approximated": t.approximated,
            "refused": t.refused, "valid_parsed": t.valid_parsed, "valid_refused": t.valid_refused,
            "invalid_parsed": t.invalid_parsed, "invalid_rejected": t.invalid_rejected,
            "grammar_admits_invalid": t.grammar_admits_invalid, "invalid_parsed_target": 0,
            "ratio": round(compiled / t.schemas, 4), "target": 0.95, "better": "higher"})


if __name__ == "__main__":
    main()
