"""The study end to end on the fake backend (run, resume, report, verify), the statistics' pairing, D_paired,
and the
pre-registration lock."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest
from test_metatool_support import scripted_model

from formtax.backends.fake import FakeBackend
from formtax.cli.main import main
from formtax.errors import ConfigError
from formtax.records import read_records
from formtax.records.schema import ParseRecord, Record
from formtax.report import load_records, verify_report, write_report
from formtax.runner import RunConfig, run
from formtax.stats import bootstrap_replicates, crossed_variance
from formtax.studies.abstention.data import N_ROWS, parse_item_id, sample_positions
from formtax.studies.abstention.frame import contrast_replicates, study_frame
from formtax.studies.abstention.language import d_paired_cells, language_table
from formtax.studies.abstention.tables import transitions_table
from formtax.studies.abstention.task import MetatoolTask

REPLICATES = 400
PAIRS = 4


def choose(kind: str, names: list[str], query: str) -> str:
    """Five behaviours, picked by the query, shifted by one for the translated language (so they differ)."""
    pattern = (sum(map(ord, query)) + (1 if query.startswith("번역") else 0)) % 5
    other = names[1]
    if kind == "abstain":
        return [
            "None. No tool fits.",
            "Let me see.\nNone",
            names[0],
            f"{names[0]} or {other}",
            f"{other}? No. None.",
        ][pattern]
    gold = names[0]
    return [f"{gold}. It fits.", f"Well.\n{gold}", "None.", f"{gold} or {other}", f"None... no: {gold}"][
        pattern
    ]


def translations(tmp_path, pairs=PAIRS):
    path = tmp_path / "ko.json"
    queries = {str(p): f"번역 질문 {p}" for p in sample_positions(N_ROWS, pairs, 0)}
    path.write_text(json.dumps({"language": "ko", "queries": queries}, ensure_ascii=False))
    return path


def config(tmp_path, **kw):
    base = dict(
        task="metatool",
        strategies=["free", "short", "constrained"],
        backend="fake",
        seeds=2,
        batch_size=5,
        max_tokens=48,
        task_options={"pairs": PAIRS, "translations": str(translations(tmp_path))},
    )
    base.update(kw)
    return RunConfig(**base)


@pytest.fixture(scope="module")
def scripted_run(tmp_path_factory, data_dir):
    tmp = tmp_path_factory.mktemp("scripted")
    out = tmp / "run"
    hyp = tmp / "hypotheses.md"
    hyp.write_text("H1: the constraint repairs D0 outputs.\n")
    summary = run(config(tmp, hypotheses=str(hyp)), out, backend=scripted_model(choose))
    write_report(out, n_resamples=REPLICATES, seed=0)
    return out, hyp, summary


def _tables(out):
    return {p.stem: pd.read_csv(p) for p in (out / "tables").glob("*.csv")}


def test_run_records_every_request_once_on_one_prompt(scripted_run):
    out, _, summary = scripted_run
    recs = read_records(out / "records.jsonl")
    assert (
        summary.planned == len(recs) == PAIRS * 2 * 2 * 3 * 2
    )  # pairs x kinds x languages x conditions x seeds
    assert len({r.request_id for r in recs}) == len(recs) and all(r.scored for r in recs)
    prompts = defaultdict(set)
    for r in recs:
        prompts[(r.item_id, r.seed)].add(r.prompt_hash)
    assert all(len(v) == 1 for v in prompts.values())
    assert all(
        r.stats["first_token_mass"]["masked_mass"] >= r.stats["first_token_mass"]["masked_mass_topk"]
        for r in recs
        if r.strategy == "short"
    )


def test_report_verifies_and_a_changed_cell_is_caught(scripted_run, tmp_path):
    out, _, _ = scripted_run
    assert verify_report(out) == []
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(out, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    assert manifest["hypotheses"]["sha256"]
    path = copy / "tables" / "abstention_contrasts.csv"
    lines = path.read_text().splitlines()
    cells = lines[1].split(",")
    cells[6] = str(float(cells[6]) + 0.5)  # the estimate
    lines[1] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    problems = verify_report(copy)
    assert any("abstention_contrasts.csv" in p and "estimate" in p for p in problems)


def test_tables_match_a_direct_computation(scripted_run):
    out, _, _ = scripted_run
    t = _tables(out)
    sf = study_frame(load_records(out))
    assert sf is not None
    acc = t["abstention_accuracy"]
    for _, row in acc.iterrows():
        cell = sf[(sf["language"] == row["language"]) & (sf["condition"] == row["condition"])]
        for kind in ("abstain", "tool"):
            part = cell[cell["item_type"] == kind]
            assert row[f"{kind}_acc"] == pytest.approx(part["correct"].mean())
            assert row[f"{kind}_acc_low"] <= row[f"{kind}_acc"] <= row[f"{kind}_acc_high"]
            counts = part["category"].value_counts()
            total = sum(int(row[f"{kind}_n_{c}"]) for c in ("correct", "D0", "D2", "wrong", "order"))
            assert total == row[f"{kind}_n_scored"] == len(part)
            assert row[f"{kind}_n_D0"] == counts.get("D0", 0) and row[f"{kind}_n_D2"] == counts.get("D2", 0)
        assert row["pooled_acc"] == pytest.approx(cell["correct"].mean())  # both item types together
        assert row["pooled_acc_low"] <= row["pooled_acc"] <= row["pooled_acc_high"]
    # the script makes every category appear somewhere
    assert {"D0", "D2", "wrong", "order", "correct"} <= set(sf["category"])
    con = t["abstention_contrasts"].set_index(["language", "item_type", "contrast"])
    for lang in ("en", "ko"):
        for kind in ("abstain", "tool"):
            a = acc.set_index(["language", "condition"])[f"{kind}_acc"]
            assert con.loc[(lang, kind, "delta_mask"), "estimate"] == pytest.approx(
                a[(lang, "constrained")] - a[(lang, "short")]
            )
            assert con.loc[(lang, kind, "delta_total"), "estimate"] == pytest.approx(
                con.loc[(lang, kind, "delta_mask"), "estimate"]
                + con.loc[(lang, kind, "delta_length"), "estimate"]
            )


def test_transitions_count_what_short_produced(scripted_run):
    out, _, _ = scripted_run
    t = _tables(out)["abstention_transitions"]
    sf = study_frame(load_records(out))
    assert sf is not None
    for (lang, kind), rows in t.groupby(["language", "item_type"]):
        part = sf[(sf["language"] == lang) & (sf["item_type"] == kind)]
        short = part[part["condition"] == "short"].set_index(["position", "seed"])
        con = part[part["condition"] == "constrained"].set_index(["position", "seed"])
        j = short.merge(con, left_index=True, right_index=True, suffixes=("_s", "_c"))
        repaired = j[(j["correct_s"] == 0) & (j["correct_c"] == 1)]
        wr = rows[rows["direction"] == "wrong_to_right"].set_index("short_category")["n"]
        assert wr.sum() == len(repaired)
        for category, n in repaired["category_s"].value_counts().items():
            assert wr[category] == n
        rw = rows[rows["direction"] == "right_to_wrong"]["n"].sum()
        assert rw == len(j[(j["correct_s"] == 1) & (j["correct_c"] == 0)])


def test_language_table_is_d_paired_over_both_languages(scripted_run):
    out, _, _ = scripted_run
    lang = _tables(out)["abstention_language"].set_index("item_type")
    sf = study_frame(load_records(out))
    assert sf is not None
    for kind in ("abstain", "tool"):
        part = sf[sf["item_type"] == kind].set_index(["language", "condition", "position", "seed"])["correct"]
        s = b = c = 0
        for (language, condition, position, seed), v in part.items():
            if language != "en" or condition != "short":
                continue
            s2 = part[("ko", "short", position, seed)]
            c1, c2 = part[("en", "constrained", position, seed)], part[("ko", "constrained", position, seed)]
            if v == 1 and s2 == 1:
                s += 1
                b += int(c1 == 1 and c2 == 0)
                c += int(c1 == 0 and c2 == 1)
        row = lang.loc[kind]
        assert (row["S"], row["b"], row["c"]) == (s, b, c)
        if s:
            assert row["d_paired"] == pytest.approx((b - c) / s)
        # the language differences of delta_length and delta_total, from the six cells' means
        means = part.groupby(["language", "condition"]).mean()
        length = (means[("ko", "short")] - means[("ko", "free")]) - (means[("en", "short")] - means[("en", "free")])
        total = (means[("ko", "constrained")] - means[("ko", "free")]) - (
            means[("en", "constrained")] - means[("en", "free")])
        assert row["delta_length_diff"] == pytest.approx(length, abs=1e-6)
        assert row["delta_total_diff"] == pytest.approx(total, abs=1e-6)
        assert row["delta_length_diff_low"] <= row["delta_length_diff"] + 1e-9 <= row["delta_length_diff_high"] + 2e-9


def test_an_excluded_translation_is_recorded_and_the_languages_pair_on_common_positions(scripted_run, tmp_path):
    """A translation that leaves a position out (with a reason): that pair runs in English only, the manifest
    names the exclusion, and the language table is the full run's restricted to the positions both cover."""
    full, _, _ = scripted_run
    positions = sample_positions(N_ROWS, PAIRS, 0)
    path = tmp_path / "ko-excluded.json"
    path.write_text(json.dumps({"language": "ko", "queries": {str(p): f"번역 질문 {p}" for p in positions[1:]},
                                "excluded": {str(positions[0]): "no faithful translation"}}, ensure_ascii=False))
    out = tmp_path / "run"
    run(config(tmp_path, task_options={"pairs": PAIRS, "translations": str(path)}), out,
        backend=scripted_model(choose))
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["task_notes"] == {"translation_exclusions": {f"{positions[0]:03d}": "no faithful translation"}}
    write_report(out, n_resamples=REPLICATES, seed=0)
    assert verify_report(out) == []
    lang = _tables(out)["abstention_language"].set_index("item_type")
    assert (lang["n_positions_only_1"] == 1).all() and (lang["n_positions_only_2"] == 0).all()
    assert (lang["n_items"] == PAIRS - 1).all()
    # the same counts as the full run's records without the excluded position
    sf = study_frame(load_records(full))
    assert sf is not None
    sf = sf[sf["position"] != positions[0]]
    for kind in ("abstain", "tool"):
        part = sf[sf["item_type"] == kind].set_index(["language", "condition", "position", "seed"])["correct"]
        s = sum(int(v == 1 and part[("ko", "short", q, sd)] == 1)
                for (language, condition, q, sd), v in part.items() if language == "en" and condition == "short")
        assert lang.loc[kind, "S"] == s


def test_masked_mass_table_seeds_table_and_fit(scripted_run):
    out, _, _ = scripted_run
    t = _tables(out)
    mass = t["abstention_mass"]
    assert len(mass) == PAIRS * 2 * 2 and mass["masked_mass"].notna().all()
    assert (mass["masked_mass_topk"] <= mass["masked_mass"] + 1e-9).all()
    assert (mass["masked_mass"] <= mass["masked_mass_topk"] + 1 - mass["topk_coverage"] + 1e-9).all()
    assert (mass["penalty"] == mass["constrained_acc"] - mass["short_acc"]).all()
    assert set(t["abstention_seeds"]["outputs_differ_across_seeds"]) == {"no"}  # temperature 0
    assert set(t["abstention_mass_fit"]["analysis"]) == {"exploratory"}
    assert (out / "figures" / "abstention_mass.png").is_file()
    assert "EXPLORATORY" in (out / "report.md").read_text()


def test_hypotheses_lock(scripted_run, tmp_path):
    out, hyp, _ = scripted_run
    original = hyp.read_text()
    try:
        hyp.write_text(original + "H2: added after the results.\n")
        problems = verify_report(out)
        assert any("changed after it was registered" in p for p in problems)
        with pytest.raises(ConfigError, match="changed since it was registered"):
            run(config(hyp.parent, hypotheses=str(hyp)), out, backend=scripted_model(choose))
    finally:
        hyp.write_text(original)
    assert verify_report(out) == []


def test_hypotheses_registered_after_records_are_refused(tmp_path):
    cfg = config(tmp_path, task_options={"pairs": 1}, strategies=["short"], seeds=1)
    out = tmp_path / "run"
    run(cfg, out, backend=scripted_model(choose))
    (out / "manifest.json").unlink()  # a manifest lost (or removed) while records exist
    hyp = tmp_path / "h.md"
    hyp.write_text("late\n")
    with pytest.raises(ConfigError, match="must be registered before any"):
        run(
            config(tmp_path, task_options={"pairs": 1}, strategies=["short"], seeds=1, hypotheses=str(hyp)),
            out,
            backend=scripted_model(choose),
        )


class Crash(FakeBackend):
    """The scripted model, killed (KeyboardInterrupt) when its n-th batch starts."""

    def __init__(self, n):
        inner = scripted_model(choose)
        super().__init__(inner.fn, model_id=inner.model_id)
        self.n = n

    def new_batch(self, prompts):
        if len(self.batches) >= self.n:
            raise KeyboardInterrupt
        return super().new_batch(prompts)


def test_a_crashed_run_resumes_without_duplicates(tmp_path):
    cfg = config(tmp_path, task_options={"pairs": 2})
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run(cfg, out, backend=Crash(3))
    before = (out / "records.jsonl").read_bytes()
    s = run(cfg, out, backend=scripted_model(choose))
    after = (out / "records.jsonl").read_bytes()
    assert after.startswith(before) and s.skipped == before.count(b"\n") > 0
    recs = read_records(out / "records.jsonl")
    assert len(recs) == len({r.request_id for r in recs}) == s.planned == 2 * 2 * 3 * 2
    with pytest.raises(ConfigError, match="another configuration"):
        run(config(tmp_path, task_options={"pairs": 3}), out, backend=scripted_model(choose))


def test_runner_refuses_differing_prompts_and_misplaced_options(tmp_path, monkeypatch):
    original = MetatoolTask.messages

    def by_format(self, item, output_format, tv, fv, shots):
        msgs = original(self, item, output_format, tv, fv, shots)
        return [{"role": "user", "content": msgs[0]["content"] + str(output_format)}]

    with pytest.raises(ConfigError, match="task 'arith' takes no task options"):
        run(
            RunConfig(task="arith", strategies=["free"], backend="fake", limit=1, task_options={"pairs": 2}),
            tmp_path / "a",
        )
    with pytest.raises(ConfigError, match="--limit does not apply"):
        run(config(tmp_path, limit=3), tmp_path / "b")
    monkeypatch.setattr(MetatoolTask, "messages", by_format)
    with pytest.raises(ConfigError, match="must share one prompt"):
        run(config(tmp_path, task_options={"pairs": 1}), tmp_path / "c")
    assert not (tmp_path / "c" / "records.jsonl").exists()


def test_cli_run_report_verify(tmp_path, capsys):
    out = tmp_path / "cli"
    hyp = tmp_path / "hyp.md"
    hyp.write_text("registered\n")
    args = [
        "run",
        "--task",
        "metatool",
        "--strategies",
        "free,short,constrained",
        "--backend",
        "fake",
        "--pairs",
        "2",
        "--seeds",
        "2",
        "--max-tokens",
        "24",
        "--translations",
        str(translations(tmp_path, 2)),
        "--hypotheses",
        str(hyp),
        "--out",
        str(out),
    ]
    assert main(args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert (
        manifest["config"]["task_options"]["pairs"] == 2 and manifest["hypotheses"]["text"] == "registered\n"
    )
    assert any(k.endswith("ko.json") for k in manifest["data_files"])
    assert main(["report", str(out), "--replicates", "200"]) == 0
    assert main(["verify", str(out)]) == 0
    hyp.write_text("edited\n")
    assert main(["verify", str(out)]) == 1
    assert "changed after it was registered" in capsys.readouterr().out


# -- the statistics on hand-made matrices --------------------------------------------------------------------


def test_contrasts_are_paired_and_add_up_per_replicate():
    rng = np.random.default_rng(3)
    cells = {c: rng.integers(0, 2, size=(30, 5)).astype(float) for c in ("free", "short", "constrained")}
    raw = bootstrap_replicates(cells, 2000, 7)  # the shared draw: the contrasts add up per replicate
    np.testing.assert_allclose(raw["constrained"] - raw["free"],
                               (raw["constrained"] - raw["short"]) + (raw["short"] - raw["free"]), atol=1e-12)
    reps = contrast_replicates(cells, 2000, 7)  # each corrected about its estimate by its own components
    for name, (a, b) in (("delta_total", ("constrained", "free")), ("delta_mask", ("constrained", "short"))):
        d = cells[a] - cells[b]
        assert reps[name].var() == pytest.approx(crossed_variance(d), rel=1e-9)
        assert np.median(reps[name]) == pytest.approx(d.mean(), abs=0.02)
    # identical cells: a paired contrast has no variance at all (an unpaired one would)
    same = contrast_replicates(
        {"free": cells["free"], "short": cells["free"], "constrained": cells["free"]}, 500, 0
    )
    assert all(np.all(v == 0.0) for v in same.values())
    # resampling is joint over items and seeds: a seed-only effect still varies
    seed_effect = np.tile(np.array([0.0, 0.0, 1.0, 1.0, 1.0]), (30, 1))
    r = contrast_replicates({"short": np.zeros((30, 5)), "constrained": seed_effect}, 500, 0)["delta_mask"]
    assert r.std() > 0


def test_d_paired_cells_on_a_hand_example():
    s1 = np.array([[1.0], [1.0], [1.0], [0.0], [1.0]])
    s2 = np.array([[1.0], [1.0], [1.0], [1.0], [0.0]])
    c1 = np.array([[1.0], [0.0], [1.0], [1.0], [1.0]])
    c2 = np.array([[0.0], [1.0], [0.0], [0.0], [0.0]])
    cells = d_paired_cells(s1, c1, s2, c2)
    s, b, c = (int(cells[k].sum()) for k in ("S", "b", "c"))
    assert (s, b, c) == (3, 2, 1)  # items 0 and 2 only language 2 lost; item 1 only language 1 lost
    assert parse_item_id("017-abstain-ko").language == "ko"


def _record(item: str, strategy: str, text: str, language: str, position: int) -> Record:
    from formtax.tasks import Item, OutputFormat

    kind = "abstain"
    cands = ("Zapier", "Chess")
    item_id = f"{position:03d}-{kind}" + ("" if language == "en" else f"-{language}")
    it = Item(
        id=item_id, question="q", gold="None", choices=tuple((c, "") for c in cands), meta={"kind": kind}
    )
    parses = MetatoolTask().parse_output(text, it, OutputFormat.ANSWER_ONLY)
    return Record(
        request_id=f"{item_id}-{strategy}",
        task="metatool",
        item_id=item_id,
        item_hash="h",
        strategy=strategy,
        base_strategy=strategy,
        level="vc" if strategy == "constrained" else "none",
        rc=False,
        output_format="answer-only",
        prompt_variant="t1f1",
        seed=0,
        shots=0,
        model="hand",
        batch_size=1,
        prompt_hash="p",
        prompt="p",
        gold="None",
        answer_spec="choice:Zapier|Chess|None",
        text=text,
        answer_text=text,
        parses={k: ParseRecord(status=v.status, value=v.value, raw=v.raw) for k, v in parses.items()},
        scores={k: v.ok and v.value == "None" for k, v in parses.items()},
    )


def test_language_table_on_hand_made_records(tmp_path):
    # (en short, ko short, en constrained, ko constrained) per position
    outcomes = {
        0: ("None", "None", "None", "Zapier"),  # in S; only ko lost -> b
        1: ("None", "None", "Zapier", "None"),  # in S; only en lost -> c
        2: ("None", "None", "Zapier", "Chess"),  # in S; both lost -> neither
        3: ("None", "None", "None", "Chess"),  # in S -> b
        4: ("None", "Zapier", "None", "None"),  # not in S (ko wrong under short)
        5: ("I think so", "None", "Zapier", "None"),  # not in S (en D0 under short)
    }
    recs = []
    for pos, (es, ks, ec, kc) in outcomes.items():
        recs += [
            _record("x", "short", es, "en", pos),
            _record("x", "short", ks, "ko", pos),
            _record("x", "constrained", ec, "en", pos),
            _record("x", "constrained", kc, "ko", pos),
        ]
    (tmp_path / "records.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in recs))
    table = language_table(load_records(tmp_path), 2000, 0)
    assert table is not None and list(table["item_type"]) == ["abstain"]
    row = table.iloc[0]
    assert (row["S"], row["b"], row["c"]) == (4, 2, 1)
    assert row["d_paired"] == pytest.approx(0.25)
    assert row["d_paired_low"] <= 0.25 <= row["d_paired_high"]
    assert row["short_acc_1"] == pytest.approx(5 / 6) and row["short_acc_2"] == pytest.approx(5 / 6)
    assert row["delta_mask_2"] - row["delta_mask_1"] == pytest.approx(row["delta_mask_diff"])
    transitions = transitions_table(load_records(tmp_path), 0, 0)
    assert transitions is not None
    en = transitions[(transitions["language"] == "en") & (transitions["direction"] == "wrong_to_right")]
    assert en.set_index("short_category")["n"].to_dict() == {"D0": 0, "wrong": 0, "D2": 0, "order": 0}
    ko = transitions[(transitions["language"] == "ko")].set_index(["direction", "short_category"])["n"]
    assert ko[("wrong_to_right", "wrong")] == 1 and ko[("right_to_wrong", "correct")] == 3


def test_a_run_with_only_tool_items_reports_and_verifies(scripted_run, tmp_path):
    """No abstention items at all (e.g. a filtered run): every table renders, nothing raises."""
    import json
    import shutil

    from formtax.report import verify_report

    out, _, _ = scripted_run
    only = tmp_path / "only-tools"
    only.mkdir()
    shutil.copy(out / "manifest.json", only / "manifest.json")
    lines = (out / "records.jsonl").read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if json.loads(line)["item_id"].endswith("-tool")]
    assert 0 < len(kept) < len(lines)
    (only / "records.jsonl").write_text("\n".join(kept) + "\n", encoding="utf-8")
    write_report(only, n_resamples=REPLICATES, seed=0)
    assert verify_report(only) == []


def test_tables_one_and_three_share_one_basis_under_missing_data(scripted_run, tmp_path):
    """Records missing in one condition drop the item from every condition's Table 1 accuracy too, so that
    constrained - short from Table 1 equals Table 3's delta_mask."""
    import json
    import shutil

    out, _, _ = scripted_run
    gap = tmp_path / "gappy"
    gap.mkdir()
    shutil.copy(out / "manifest.json", gap / "manifest.json")
    lines = (out / "records.jsonl").read_text(encoding="utf-8").splitlines()
    recs = [json.loads(line) for line in lines]
    victims = sorted({r["item_id"] for r in recs if r["item_id"].endswith("-tool")})[:2]
    kept = [line for line, r in zip(lines, recs, strict=True)
            if not (r["item_id"] in victims and r["strategy"] == "short")]
    (gap / "records.jsonl").write_text("\n".join(kept) + "\n", encoding="utf-8")
    write_report(gap, n_resamples=REPLICATES, seed=0)
    t = _tables(gap)
    acc = t["abstention_accuracy"].set_index(["language", "condition"])
    con = t["abstention_contrasts"].set_index(["language", "item_type", "contrast"])
    dropped = 0
    for lang in sorted(set(t["abstention_accuracy"]["language"])):
        diff = acc.loc[(lang, "constrained"), "tool_acc"] - acc.loc[(lang, "short"), "tool_acc"]
        assert diff == pytest.approx(con.loc[(lang, "tool", "delta_mask"), "estimate"], abs=1e-6)
        dropped += int(acc.loc[(lang, "constrained"), "tool_n_items_dropped"])
        assert acc.loc[(lang, "constrained"), "tool_n_items_dropped"] == con.loc[
            (lang, "tool", "delta_mask"), "n_items_dropped"]
    assert dropped >= 2  # the two items missing under short, dropped from constrained's accuracy as well


def test_a_two_model_report_holds_each_models_abstention_tables(scripted_run, tmp_path):
    """Paper 002's per-model tables: two models' metatool runs pooled into one report, each study table computed
    on each model alone (rows labelled ``metatool | MODEL``), equal to that model's own report; it verifies."""
    first, _, _ = scripted_run

    def other(kind: str, names: list[str], query: str) -> str:  # a second model: abstains on everything
        return "None."

    second = tmp_path / "second"
    run(config(tmp_path), second, backend=scripted_model(other, model_id="fake-abstainer"))
    write_report(second, n_resamples=REPLICATES, seed=0)
    pooled = tmp_path / "pooled"
    assert main(["report", str(first), str(second), "--out", str(pooled), "--replicates", str(REPLICATES)]) == 0
    assert verify_report(pooled) == []
    tables = _tables(pooled)
    labels = {"metatool | fake-scripted": first, "metatool | fake-abstainer": second}
    for name in ("abstention_accuracy", "abstention_contrasts", "abstention_transitions", "abstention_language"):
        assert set(tables[name]["task"]) <= set(labels), name
        for label, own_dir in labels.items():
            own = pd.read_csv(own_dir / "tables" / f"{name}.csv")
            mine = tables[name][tables[name]["task"] == label].assign(task="metatool").reset_index(drop=True)
            pd.testing.assert_frame_equal(mine, own, check_dtype=False, obj=f"{name} {label}")
    acc = tables["abstention_accuracy"]
    assert set(acc["task"]) == set(labels)
    abstainer = acc[(acc["task"] == "metatool | fake-abstainer") & (acc["strategy"] == "free")]
    assert (abstainer["abstain_acc"] == 1.0).all() and (abstainer["tool_acc"] == 0.0).all()
    assert "computed per model" in (pooled / "report.md").read_text(encoding="utf-8")


def test_abstention_intervals_at_the_boundary_are_not_points(tmp_path):
    """A model right everywhere: accuracies of 1 and contrasts of 0 with no position differing. The percentile
    bootstrap printed [1, 1] and [0, 0]; Wilson on the positions (and its paired boundary form) leaves room."""

    def oracle(kind: str, names: list[str], query: str) -> str:
        return "None" if kind == "abstain" else names[0]

    out = tmp_path / "run"
    run(config(tmp_path, seeds=1, task_options={"pairs": PAIRS}), out, backend=scripted_model(oracle))
    write_report(out, n_resamples=REPLICATES, seed=0)
    assert verify_report(out) == []
    tables = _tables(out)
    acc = tables["abstention_accuracy"]
    assert (acc["abstain_acc"] == 1.0).all() and (acc["tool_acc"] == 1.0).all()
    assert (acc["abstain_acc_low"] < 0.6).all() and (acc["abstain_acc_high"] == 1.0).all()  # Wilson 4 of 4: 0.51
    con = tables["abstention_contrasts"]
    assert (con["estimate"] == 0.0).all()
    assert (con["low"] < -0.4).all() and (con["high"] > 0.4).all()  # 0 of 4 positions differ: +-0.49
