"""decog and ctrlg on the fake backend: format compliance, options, errors, the runner, report and verify."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import formtax
from formtax.backends.fake import FakeBackend, random_logits, scripted
from formtax.constraints import parse_spec
from formtax.errors import ConfigError
from formtax.fem.artifact import load_fem, save_fem
from formtax.records import read_records
from formtax.report import verify_report, write_report
from formtax.runner import RunConfig, run
from formtax.strategies import Request, get_strategy
from formtax.strategies.decog import parse_fem_spec

Q = [{"role": "user", "content": "What is 2+3?"}]
TEMPLATES = ["The answer is: {int}", "The final answer is {int:0..99}", "Rating: {choice:good|bad}", "{letters:3}"]


def gen(backend, strategy, answer, fem, max_tokens=48, **options):
    return formtax.strategies.get_strategy(strategy).run(
        backend, [Request(Q, parse_spec(answer), max_tokens=max_tokens, options={"fem": fem, **options})])[0]


@pytest.mark.parametrize("strategy", ["decog", "ctrlg"])
def test_every_output_is_in_the_format(fake_fem_paths, strategy: str) -> None:
    for seed in range(2):
        backend = FakeBackend(random_logits(seed=seed))
        for answer in TEMPLATES:
            for budget in (24, 40):
                r = gen(backend, strategy, answer, fake_fem_paths[strategy], max_tokens=budget)
                c = parse_spec(answer)
                assert r.error is None and r.finish_reason in ("eos", "length"), (answer, r.finish_reason)
                assert r.parse_ok and c.validate(r.answer_text).ok, (answer, r.text)
                assert r.text.endswith(r.answer_text)
                assert r.text.rsplit("\n", 1)[-1].lstrip(" ") == r.answer_text
                assert r.tokens.total <= budget
                assert sum(r.tokens.by_phase.values()) == r.tokens.total
                assert r.stats["fem_form"] == ("instruction-aware" if strategy == "decog" else "unconditional")
                assert len(r.stats["fem_mass"]) == r.tokens.total


def test_a_model_that_already_writes_the_format_keeps_its_text(fake_fem_paths) -> None:
    script = "Let me think. 2+3=5.\nThe answer is: 5"
    r = gen(FakeBackend(scripted(script, margin=30.0)), "decog", "The answer is: {int}", fake_fem_paths["decog"], 100)
    assert r.text == script and r.parsed == 5 and r.finish_reason == "eos"
    assert r.reasoning == "Let me think. 2+3=5.\n" and r.answer_text == "The answer is: 5"
    assert r.tokens.by_phase == {"reasoning": len(b"Let me think. 2+3=5.\n"), "answer": len(b"The answer is: 5") + 1}


def test_a_model_that_never_answers_is_still_put_in_the_format_in_time(fake_fem_paths) -> None:
    r = gen(FakeBackend(scripted("blah " * 100, margin=30.0)), "decog", "The answer is: {int}",
            fake_fem_paths["decog"], 40)
    assert r.parse_ok and r.finish_reason in ("eos", "length") and r.tokens.total <= 40


def test_options_placement_gamma_topk_and_rc(fake_fem_paths) -> None:
    backend = FakeBackend(random_logits(seed=4))
    r = gen(backend, "decog", "The answer is: {int}", fake_fem_paths["decog"], 40, placement="anywhere", gamma=3.0,
            state_top_k=2)
    assert r.parse_ok and r.stats["fem_top_k"] == 2 and r.stats["fem_gamma"] == 3.0
    assert r.answer_text in r.text and parse_spec("The answer is: {int}").validate(r.answer_text).ok
    assert sum(r.tokens.by_phase.values()) == r.tokens.total
    assert all(0 < m <= 1 for m in r.stats["fem_mass"])
    req = Request(Q, parse_spec("The answer is: {int}"), max_tokens=40, reasoning_prefix="Let's think.",
                  options={"fem": fake_fem_paths["ctrlg"]})
    r = get_strategy("ctrlg").run(backend, [req])[0]
    assert r.text.startswith("Let's think.") and r.parse_ok and r.tokens.by_phase["rc"] == len("Let's think.")
    # the level "none" (constrain=False) decodes freely with the same prompt and budget
    free = get_strategy("decog").run(backend, [Request(Q, parse_spec("The answer is: {int}"), max_tokens=20,
                                                       constrain=False, options={"fem": fake_fem_paths["decog"]})])[0]
    assert "fem_mass" not in free.stats


def test_clear_errors(fake_fem_paths) -> None:
    backend = FakeBackend()
    with pytest.raises(ConfigError, match="needs an HMM"):
        gen(backend, "decog", "The answer is: {int}", None)
    with pytest.raises(ConfigError, match="unconditional"):
        gen(backend, "decog", "The answer is: {int}", fake_fem_paths["ctrlg"])
    assert gen(backend, "decog", "The answer is: {int}", fake_fem_paths["ctrlg"], allow_form=True).parse_ok
    with pytest.raises(ConfigError, match="answer template"):
        gen(backend, "decog", "regex:[0-9]+", fake_fem_paths["decog"])
    with pytest.raises(ConfigError, match="max_tokens"):
        gen(backend, "decog", "The answer is: {int}", fake_fem_paths["decog"], max_tokens=5)
    with pytest.raises(ConfigError, match="unknown option"):
        gen(backend, "decog", "The answer is: {int}", f"decog={fake_fem_paths['decog']},gama=2")
    # an artifact for another tokenizer
    art = load_fem(fake_fem_paths["decog"])
    other = save_fem(fake_fem_paths["decog"].replace("decog.npz", "other.npz"), art.hmm,
                     {**art.meta, "tokenizer_sha256": "x"})
    with pytest.raises(ConfigError, match="another tokenizer"):
        gen(backend, "decog", "The answer is: {int}", str(other))


def test_fem_spec_parsing() -> None:
    assert parse_fem_spec("a.npz", "decog") == ("a.npz", {})
    spec = "decog=a.npz,ctrlg=b.npz,gamma=2,ctrlg.top_k=5,decog.gamma=3"
    assert parse_fem_spec(spec, "ctrlg") == ("b.npz", {"gamma": "2", "top_k": "5"})
    assert parse_fem_spec(spec, "decog") == ("a.npz", {"gamma": "3"})
    with pytest.raises(ConfigError):
        parse_fem_spec("decog=a.npz,oops", "decog")


def test_runner_report_and_verify_with_both_strategies(tmp_path, fake_fem_paths) -> None:
    cfg = RunConfig(task="arith", strategies=["free", "decog", "ctrlg"], backend="fake", limit=3, max_tokens=40,
                    batch_size=2, fem=f"decog={fake_fem_paths['decog']},ctrlg={fake_fem_paths['ctrlg']}")
    s = run(cfg, tmp_path)
    assert s.errors == 0
    recs = read_records(tmp_path / "records.jsonl")
    fem_recs = [r for r in recs if r.base_strategy in ("decog", "ctrlg")]
    assert len(fem_recs) == 6 and all(r.constraint_ok for r in fem_recs)
    assert all(r.parses["strict"].status == "ok" for r in fem_recs)  # the strict parser reads the last line
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["config_identity"]["fem"] == cfg.fem
    write_report(tmp_path, n_resamples=200)
    assert verify_report(tmp_path) == []
    # a run config without fem keeps the old identity (old run directories still resume)
    assert "fem" not in RunConfig(task="arith", strategies=["free"]).identity()


def test_cli_fem_build_info_and_generate_errors(tmp_path, capsys) -> None:
    from formtax.cli.main import main

    out = tmp_path / "cli.npz"
    rc = main(["fem", "build", "--backend", "fake", "--task", "arith", "--states", "4", "--samples", "2",
               "--max-tokens", "8", "--em-iters", "1", "--out", str(out)])
    assert rc == 0 and out.is_file() and out.with_suffix(".json").is_file()
    assert main(["fem", "info", str(out)]) == 0
    assert '"form": "instruction-aware"' in capsys.readouterr().out
    assert main(["generate", "-s", "decog", "-a", "The answer is: {int}", "hi"]) == 2
    assert "needs an HMM: pass --fem FILE" in capsys.readouterr().err
    assert main(["generate", "-s", "ctrlg", "-a", "The answer is: {int}", "--fem", str(out), "hi"]) == 2
    assert "instruction-aware" in capsys.readouterr().err  # the wrong form, refused before the model loads
    assert main(["generate", "-s", "free", "--fem", str(out), "hi"]) == 2
    assert "--fem applies to ctrlg, decog, not 'free'" in capsys.readouterr().err


def test_the_runner_gives_the_fem_option_only_to_fem_strategies(tmp_path, fake_fem_paths) -> None:
    cfg = RunConfig(task="arith", strategies=["suffix-last", "decog"], backend="fake", limit=2, max_tokens=40,
                    fem=fake_fem_paths["decog"])
    assert run(cfg, tmp_path).errors == 0


def test_top_k_is_a_share_of_the_states_by_default(fake_fem_paths) -> None:
    """Deco-G keeps 5% of the states by default (the paper: 200 of 4096), so pruning runs at CPU sizes too."""
    from formtax.strategies.decog import resolve_top_k

    assert resolve_top_k("5%", 4096) == 205 and resolve_top_k("5%", 8) == 1 and resolve_top_k("25%", 8) == 2
    assert resolve_top_k(200, 4096) == 200 and resolve_top_k("none", 8) is None and resolve_top_k(0, 8) is None
    with pytest.raises(ValueError):
        resolve_top_k("150%", 8)
    r = gen(FakeBackend(), "decog", "The answer is: {int}", fake_fem_paths["decog"], 40, placement="anywhere")
    assert r.stats["fem_top_k"] == 1 and r.stats["fem_h"] == 8  # ceil(5% of 8)
    assert all(0.0 < m <= 1.0 + 1e-9 for m in r.stats["fem_mass"])


def test_the_report_draws_the_retained_mass_per_step(tmp_path, fake_fem_paths) -> None:
    from formtax.report import verify_report, write_report

    cfg = RunConfig(task="arith", strategies=["decog", "free"], backend="fake", limit=3, max_tokens=40,
                    fem=fake_fem_paths["decog"])
    assert run(cfg, tmp_path).errors == 0
    write_report(tmp_path, n_resamples=100)
    assert verify_report(tmp_path) == []
    table = pd.read_csv(tmp_path / "tables" / "fem_mass.csv")
    assert set(table["strategy"]) == {"decog"} and (table["mass_mean"] <= 1.0 + 1e-9).all()
    assert (table["step"] == 0).any() and (tmp_path / "figures" / "fem_mass.png").is_file()
    cost = pd.read_csv(tmp_path / "tables" / "fem_cost.csv")
    assert list(cost["strategy"]) == ["decog"] and (cost["ms_per_step_mean"] > 0).all() and (cost["h"] == 8).all()


def test_gsm8k_decodes_deco_gs_key_phrase_anywhere_by_default(tmp_path, fake_fem_paths, data_dir) -> None:
    """Deco-G's GSM8K setting (paper 001): the key phrase "The final answer is ..." only has to appear; the prompt
    asks for it, the FEM enforces it placed anywhere, the strict parser reads it, and the report says so."""
    from formtax.parsing import parse_all
    from formtax.tasks import OutputFormat, get_task

    cfg = RunConfig(task="gsm8k", strategies=["decog", "free", "constrained", "free:plain"], backend="fake", limit=2,
                    max_tokens=48, fem=fake_fem_paths["decog"], data_dir=str(data_dir))
    assert run(cfg, tmp_path / "a").errors == 0
    recs = [r for r in read_records(tmp_path / "a" / "records.jsonl") if r.strategy == "decog"]
    assert recs and all(r.output_format == "reason-keyphrase" for r in recs)
    for r in recs:
        assert r.answer_spec == "The final answer is {int:0..}" and r.stats["fem_placement"] == "anywhere"
        assert "The final answer is <answer>" in r.prompt
        assert r.constraint_ok and r.parses["strict"].status == "ok", r.text
        assert parse_spec(r.answer_spec).validate(r.answer_text).ok
    # paper 001 prompts its natural-language baselines for the same phrase (section 4.1): one prompt for all
    by_strategy = {s: [r for r in read_records(tmp_path / "a" / "records.jsonl") if r.strategy == s]
                   for s in ("free:keyphrase", "constrained:keyphrase", "free:plain")}
    for s in ("free:keyphrase", "constrained:keyphrase"):
        got = by_strategy[s]
        assert len(got) == 2 and all(r.output_format == "reason-keyphrase" for r in got), s
        assert {r.prompt for r in got} == {r.prompt for r in recs}  # byte-identical to Deco-G's prompts
    constrained = by_strategy["constrained:keyphrase"]
    assert all(r.answer_spec == "The final answer is {int:0..}" and r.constraint_ok for r in constrained)
    assert all(r.text.startswith("The final answer is ") and r.parses["strict"].status == "ok" for r in constrained)
    assert all(r.output_format == "reason-answer" for r in by_strategy["free:plain"])  # :plain keeps the line
    alone = RunConfig(task="gsm8k", strategies=["free"], backend="fake", limit=1, max_tokens=16,
                      data_dir=str(data_dir))
    assert run(alone, tmp_path / "alone").errors == 0  # without a FEM strategy free keeps its answer line
    assert [r.output_format for r in read_records(tmp_path / "alone" / "records.jsonl")] == ["reason-answer"]
    write_report(tmp_path / "a", n_resamples=50)
    assert verify_report(tmp_path / "a") == []
    cost = pd.read_csv(tmp_path / "a" / "tables" / "fem_cost.csv")
    assert list(cost["placement"]) == ["anywhere"] and list(cost["answer_format"]) == [recs[0].answer_spec]
    # --fem can still place it at the end
    cfg_end = RunConfig(task="gsm8k", strategies=["decog"], backend="fake", limit=1, max_tokens=48,
                        fem=f"decog={fake_fem_paths['decog']},placement=end", data_dir=str(data_dir))
    assert run(cfg_end, tmp_path / "b").errors == 0
    assert read_records(tmp_path / "b" / "records.jsonl")[0].stats["fem_placement"] == "end"
    # the strict parser: the last phrase anywhere, its answer in canonical form; the lenient one repairs
    task = get_task("gsm8k")
    item = task.load(data_dir)[0]
    fmt = OutputFormat.REASON_KEYPHRASE
    cases = {"So The final answer is 18. Done.": ("ok", "18"), "The final answer is 18, as shown": ("ok", "18"),
             "The final answer is 18.00": ("invalid", None), "The answer is: 18": ("no_answer", None),
             "The final answer is 3 or The final answer is 7 dollars": ("ok", "7")}
    for text, (status, value) in cases.items():
        got = parse_all(text, task, item, fmt)
        assert (got["strict"].status, got["strict"].value) == (status, value), text
    assert parse_all("The final answer is 18.00", task, item, fmt)["lenient"].value == "18"
