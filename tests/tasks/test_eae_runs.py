"""EAE end to end: every strategy the issue names runs through the runner (fake backend, milliseconds), every
constrained output passes the oracle and the strict parser, and the report's eae table is verified; then a few
items on the embedded default model."""

from __future__ import annotations

import json

import pytest

from formtax.backends.fake import FakeBackend, random_logits
from formtax.constraints import parse_spec
from formtax.fem.artifact import save_fem
from formtax.records import read_records
from formtax.report import verify_report, write_report
from formtax.report.load import load_records
from formtax.runner import RunConfig, run
from formtax.runner.distill import DistillConfig, build_fem
from formtax.studies.eae.report import eae_table

STRATEGIES = ["free", "constrained@fc", "constrained@vc", "json@fc", "json@vc", "inwriting@fc", "inwriting@vc",
              "nl2format@vc", "decog@fc", "decog@vc", "ctrlg@fc"]


def _check_records(out, strategies) -> None:
    recs = read_records(out / "records.jsonl")
    assert {r.strategy for r in recs} == set(strategies)
    for r in recs:
        assert r.error is None, (r.strategy, r.error)
        if r.level != "none":
            assert r.constraint_ok, (r.strategy, r.text)
            c = parse_spec(r.answer_spec)
            text = r.answer_text
            assert text is not None
            if r.base_strategy == "json":  # the record is the answer field of {"reason": ..., "answer": ...}
                text = json.dumps(json.loads(text)["answer"], ensure_ascii=False)
            assert c.validate(text).ok, (r.strategy, text)
            assert r.parses["strict"].status == "ok", (r.strategy, r.text)


def test_every_strategy_on_the_fake_backend(tmp_path) -> None:
    fems = {}
    for name, form in (("decog", "instruction-aware"), ("ctrlg", "unconditional")):
        hmm, meta = build_fem(FakeBackend(), DistillConfig(task="eae-wikievents", form=form, states=8, samples=4,
                                                           max_tokens=24, em_iters=1))
        fems[name] = str(save_fem(tmp_path / f"{name}.npz", hmm, meta))
    cfg = RunConfig(task="eae-wikievents", strategies=STRATEGIES, backend="fake", limit=3, max_tokens=420,
                    fem=f"decog={fems['decog']},ctrlg={fems['ctrlg']}")
    out = tmp_path / "run"
    run(cfg, out, backend=FakeBackend(random_logits(seed=1)))
    _check_records(out, STRATEGIES)
    write_report(out)
    assert verify_report(out) == []
    table = eae_table(load_records(out), 50, 0)
    assert table is not None and set(table["strategy"]) == set(STRATEGIES)
    assert (table["n_gold"] == table["n_gold"].iloc[0]).all()  # the same gold arguments for every strategy


@pytest.mark.slow
@pytest.mark.model
def test_a_few_items_on_the_default_model(tmp_path, default_model) -> None:
    strategies = ["constrained@fc", "constrained@vc", "json@vc", "decog@fc"]
    hmm, meta = build_fem(default_model, DistillConfig(task="eae-wikievents", states=16, samples=2, max_tokens=16,
                                                       em_iters=1, batch_size=2))
    fem = str(save_fem(tmp_path / "fem.npz", hmm, meta))
    cfg = RunConfig(task="eae-wikievents", strategies=strategies, limit=2, max_tokens=420, reasoning_tokens=40,
                    fem=fem)
    out = tmp_path / "run"
    run(cfg, out, backend=default_model)
    _check_records(out, strategies)
    write_report(out)
    assert verify_report(out) == []
    table = eae_table(load_records(out), 0, 0)
    assert table is not None
    vc = table[(table["strategy"] == "constrained@vc") & (table["parser"] == "strict")].iloc[0]
    assert vc["parse_rate"] == 1.0 and vc["span_in_passage_rate"] == 1.0  # VC: every argument is a passage span
