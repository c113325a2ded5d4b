"""Golden outputs of every strategy, the safety net for reshaping the core (issue 17) and batching its step (issue 18).

``tests/fixtures/golden_strategies.json`` holds, for every registered strategy (and the RC prefix, sampling, the JSON
answer form) on the fake backend with two logit seeds, on the default model (2 prompts) and for one planted run: the
token ids, finish reasons, phases, masked mass, the answer text and the parse result of each output, and for the
planted run its records (timings aside) and its decomposition table. A change to the core that keeps behaviour leaves
them byte-identical. Regenerate only on purpose, with the reason in the commit:

    FORMTAX_GOLDEN_WRITE=1 python -m pytest tests/core/test_golden_strategies.py

The default-model part (2 prompts) takes about 45 s on a quiet 2-core machine and runs in the default suite (issue
56). Its outputs do not depend on the machine's load: closing's searches are bounded by their work first and, as a
backstop, by the thread's CPU time (constraints/clock.py), not by wall time, which under load had moved json's
output from one run to the next.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import formtax
from formtax.backends.fake import FakeBackend, random_logits
from formtax.fem.artifact import save_fem
from formtax.runner.distill import DistillConfig, build_fem

PATH = Path(__file__).parents[1] / "fixtures" / "golden_strategies.json"
WRITE = os.environ.get("FORMTAX_GOLDEN_WRITE") == "1"
PROMPTS = ["What is 2 + 3?", "Name a colour.", "How many legs has a spider?", "Spell cat backwards."]
TEMPLATE = "The answer is: {int}"
CASES: list[tuple[str, str | None, dict[str, Any]]] = [
    ("free", None, {}),
    ("short", None, {}),
    ("constrained", TEMPLATE, {}),
    ("constrained", "choice:red|green|blue", {}),
    ("json", "{int}", {}),
    ("json", "{str}", {"json_layout": "compact"}),
    ("inwriting", TEMPLATE, {}),
    ("inwriting", TEMPLATE, {"reasoning": "Let's think step by step."}),
    ("inwriting", TEMPLATE, {"temperature": 1.0, "seed": 3}),
    ("nl2format", TEMPLATE, {}),
    ("suffix-pipeline", TEMPLATE, {}),
    ("suffix-last", TEMPLATE, {}),
    ("suffix-min", TEMPLATE, {}),
    ("suffix-beam", TEMPLATE, {}),
    ("decog", TEMPLATE, {"fem": "decog"}),
    ("ctrlg", TEMPLATE, {"fem": "ctrlg"}),
]
FEM_TEMPLATE = "The answer is: {int:0..99}"


def _key(strategy: str, spec: str | None, kw: dict[str, Any]) -> str:
    return f"{strategy}|{spec}|{json.dumps(kw, sort_keys=True)}"


def _summary(r: Any) -> dict[str, Any]:
    return {"token_ids": list(r.token_ids), "finish": r.finish_reason, "phases": r.phases,
            "masked_mass": None if r.masked_mass is None else round(float(r.masked_mass), 6),
            "answer_text": r.answer_text, "parse_ok": r.parse_ok, "error": r.error}


def _outputs(backend: Any, fems: dict[str, str], max_tokens: int, prompts: list[str] = PROMPTS) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for strategy, spec, kw in CASES:
        args = dict(kw)
        options: dict[str, Any] = {}
        if "fem" in args:
            options["fem"] = fems[args.pop("fem")]
            spec = FEM_TEMPLATE
        if options:
            from formtax.constraints import parse_spec
            from formtax.strategies import Request, get_strategy

            reqs = [Request([{"role": "user", "content": p}], parse_spec(spec), max_tokens=max_tokens, options=options)
                    for p in prompts]
            results = get_strategy(strategy).run(backend, reqs)
        else:
            results = formtax.generate_batch(backend, prompts, strategy, spec, max_tokens=max_tokens, **args)
        out[_key(strategy, spec, kw)] = [_summary(r) for r in results]
    return out


def _compare(section: str, got: dict[str, Any]) -> None:
    golden = json.loads(PATH.read_text()) if PATH.is_file() else {}
    if WRITE:
        golden[section] = got
        PATH.write_text(json.dumps(golden, indent=0, sort_keys=True) + "\n")
        return
    assert section in golden, f"no golden outputs for {section}: regenerate on purpose (module docstring)"
    want = golden[section]
    assert sorted(got) == sorted(want)
    for key in sorted(want):
        assert _exact(got[key], section) == _exact(want[key], section), f"{section} {key}"
        if section.startswith("default-model"):  # its masked masses to float32 ulps (below)
            masses = [(g["masked_mass"], w["masked_mass"]) for g, w in zip(got[key], want[key], strict=True)]
            assert all((g is None) == (w is None) and (g is None or abs(g - w) <= MASS_ULPS) for g, w in masses)


MASS_ULPS = 1e-5
"""The default model's masked masses are compared to this: its float32 forward pass differs in the last bits
between CPUs and library builds (another machine's matmul kernels), which moves the 6th digit of a mass; its
tokens never move. (2e-6 until 2026-12-07, when a fresh install moved two masses by 2-3e-6 with the tree before
as with the tree after: nl2format 0.716413 against 0.716410, suffix-beam 0.827866 against 0.827868.)"""


def _exact(outputs: Any, section: str) -> Any:
    """What must be identical: everything, less the default model's masked masses (compared to MASS_ULPS)."""
    if not section.startswith("default-model"):
        return outputs
    return [{k: v for k, v in o.items() if k != "masked_mass"} for o in outputs]


@pytest.mark.parametrize("seed", [0, 1])
def test_every_strategy_on_the_fake_backend_matches_its_golden_outputs(fake_fem_paths, seed):
    _compare(f"fake-{seed}", _outputs(FakeBackend(random_logits(seed=seed)), fake_fem_paths, 100))


@pytest.mark.model
def test_every_strategy_on_the_default_model_matches_its_golden_outputs(default_model, tmp_path):
    hmms = {}
    for name, form in (("decog", "instruction-aware"), ("ctrlg", "unconditional")):
        hmm, meta = build_fem(default_model, DistillConfig(task="arith", form=form, states=8, samples=4, max_tokens=16,
                                                           em_iters=1, batch_size=4))
        hmms[name] = str(save_fem(tmp_path / f"{name}.npz", hmm, meta))
    _compare("default-model", _outputs(default_model, hmms, 100, PROMPTS[:2]))


def test_a_planted_run_gives_its_golden_records_and_tables(tmp_path):
    from formtax.planted.calibrate import calibrate
    from formtax.planted.world import write_world
    from formtax.planted.worlds import BUILTIN
    from formtax.records import read_records
    from formtax.report.load import load_records
    from formtax.report.tables import compute_tables

    path = write_world(BUILTIN["format-validity"](tokenizer="bytes"), tmp_path / "w.json")
    calibrate(str(path), tmp_path / "out", n_resamples=200)
    keep = ("item_id", "strategy", "seed", "text", "finish_reason", "phases", "answer_text", "tokens", "masked_mass",
            "parses", "scores", "budget", "constraint_ok")
    recs = sorted((json.loads(r.model_dump_json(include=set(keep))) for r in read_records(
        tmp_path / "out" / "run" / "records.jsonl")), key=lambda r: (r["strategy"], r["item_id"], r["seed"]))
    computed = compute_tables(load_records(tmp_path / "out" / "run"), n_resamples=200, seed=0)
    tables = {name: computed[name].to_csv(index=False, float_format="%.6g") for name in ("decomposition", "accuracy")}
    _compare("planted-format-validity", {"records": recs, "tables": tables})
