"""The resumable runner on the fake backend: resume, refusal, crash recovery, prompt identity."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from formtax.backends.fake import FakeBackend, random_logits
from formtax.errors import ConfigError
from formtax.records import read_records
from formtax.runner import RunConfig, run
from formtax.runner.grid import Planned, check_prompt_identity, parse_strategy_spec

STRATS = ["free", "short", "constrained", "json@fc", "json@vc", "inwriting", "nl2format", "inwriting@vc+rc"]


def cfg(**kw):
    base = dict(task="arith", strategies=STRATS, backend="fake", limit=5, seeds=2, batch_size=3)
    base.update(kw)
    return RunConfig(**base)


class InterruptAfter(FakeBackend):
    """Raises KeyboardInterrupt (like Ctrl-C) when the n-th batch starts."""

    def __init__(self, n):
        super().__init__(random_logits(seed=0), model_id="fake-random-0")
        self.n = n

    def new_batch(self, prompts):
        if len(self.batches) >= self.n:
            raise KeyboardInterrupt
        return super().new_batch(prompts)


def test_full_run_records_every_request_once(tmp_path):
    s = run(cfg(), tmp_path)
    recs = read_records(tmp_path / "records.jsonl")
    assert s.planned == len(recs) == 5 * 2 * len(STRATS)
    assert len({r.request_id for r in recs}) == len(recs)
    assert all(r.constraint_ok for r in recs if r.level != "none")
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert manifest["config"]["task"] == "arith" and manifest["packages"]["torch"]


def test_interrupt_then_resume_loses_and_duplicates_nothing(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        run(cfg(), tmp_path, backend=InterruptAfter(4))
    before = (tmp_path / "records.jsonl").read_bytes()
    assert before and before.endswith(b"\n")
    assert json.loads((tmp_path / "manifest.json").read_text())["status"] == "interrupted"
    s = run(cfg(), tmp_path)
    after = (tmp_path / "records.jsonl").read_bytes()
    assert after.startswith(before)  # nothing rewritten
    recs = read_records(tmp_path / "records.jsonl")
    assert len(recs) == s.planned and len({r.request_id for r in recs}) == s.planned
    assert s.skipped == before.count(b"\n")


def test_unfinished_last_line_is_moved_aside(tmp_path):
    run(cfg(strategies=["free"]), tmp_path)
    path = tmp_path / "records.jsonl"
    full = path.read_bytes()
    lines = full.splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][:40])  # a hard kill mid-write
    s = run(cfg(strategies=["free"]), tmp_path)
    assert s.done == 1
    assert len(read_records(path)) == len(lines)
    assert (tmp_path / "records.jsonl.partial").read_bytes().count(lines[-1][:40]) == 1


def test_other_config_is_refused(tmp_path):
    run(cfg(strategies=["free"]), tmp_path)
    with pytest.raises(ConfigError, match="another configuration .*limit"):
        run(cfg(strategies=["free"], limit=6), tmp_path)
    run(cfg(strategies=["free"], batch_size=1), tmp_path)  # speed options may change


def test_limit_takes_the_same_items_for_every_strategy(tmp_path):
    run(cfg(), tmp_path)
    recs = read_records(tmp_path / "records.jsonl")
    by = {}
    for r in recs:
        by.setdefault(r.strategy, set()).add(r.item_id)
    assert len({frozenset(v) for v in by.values()}) == 1


def test_shared_output_format_means_byte_identical_prompts(tmp_path):
    run(cfg(strategies=["free", "inwriting", "nl2format", "json@fc", "json@vc"]), tmp_path)
    recs = read_records(tmp_path / "records.jsonl")
    groups = {}
    for r in recs:
        groups.setdefault((r.item_id, r.seed, r.prompt_format or r.output_format), set()).add(r.prompt_hash)
    assert all(len(v) == 1 for v in groups.values())
    assert {r.prompt_format for r in recs if r.base_strategy == "nl2format"} == {"reasoning"}


def test_nl2format_first_prompt_is_inwritings_without_the_answer_phrase(tmp_path):
    """Paper 003: InWriting's prompt is NL-to-Format's plus one phrase (the one asking for the answer line); the
    answer format goes to NL-to-Format's second call, so its line and JSON forms reason from the same prompt."""
    run(cfg(strategies=["inwriting", "nl2format", "nl2format@vc:json"], prompt_variants="t1f1,t1f2", seeds=1,
            limit=2), tmp_path)
    recs = read_records(tmp_path / "records.jsonl")
    by = {(r.strategy, r.item_id, r.prompt_variant): r for r in recs}
    for (strategy, item, variant), r in by.items():
        if strategy != "inwriting":
            continue
        nl, nl_json = by[("nl2format", item, variant)], by[("nl2format@vc:json", item, variant)]
        assert nl.prompt == nl_json.prompt != r.prompt
        head, _, question = nl.prompt.partition("\n\nQuestion:")
        assert r.prompt.startswith(head) and r.prompt.endswith(question)
        assert "The answer is:" in r.prompt and "The answer is:" not in nl.prompt
        assert nl.output_format == "reason-answer" and nl_json.output_format == "reason-json"
        assert (nl.text, nl.reasoning) == (nl_json.text, nl_json.reasoning)  # the same first call


def test_prompt_difference_is_refused():
    from formtax.tasks import Item, get_task

    s1, s2 = parse_strategy_spec("free"), parse_strategy_spec("inwriting")
    it = Item(id="1", question="q", gold="1")
    a = Planned("a", "arith", it, s1, "t1f1", 0, 0, [{"role": "user", "content": "x"}], None, "reason-answer", 1)
    b = Planned("b", "arith", it, s2, "t1f1", 0, 0, [{"role": "user", "content": "y"}], None, "reason-answer", 1)
    with pytest.raises(ConfigError, match="prompts differ"):
        check_prompt_identity([a, b], repr)
    get_task("arith")


def test_unknown_strategy_level_and_task_fail_clearly(tmp_path):
    with pytest.raises(ConfigError, match="unknown strategy"):
        run(cfg(strategies=["nope"]), tmp_path)
    with pytest.raises(ConfigError, match="unknown constraint level"):
        run(cfg(strategies=["json@xx"]), tmp_path)
    with pytest.raises(ConfigError, match="takes no level"):
        run(cfg(strategies=["free@vc"]), tmp_path)
    with pytest.raises(ConfigError):
        run(cfg(task="nope"), tmp_path)


def test_missing_data_file_names_the_path(tmp_path):
    from formtax.errors import DataError

    with pytest.raises(DataError, match=str(tmp_path)):
        run(cfg(task="gsm8k", data_dir=str(tmp_path)), tmp_path / "out")


def test_sigkill_mid_run_then_rerun(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "formtax", "run", "--backend", "fake", "--task", "arith", "--strategies",
           "free,constrained", "--limit", "150", "--batch-size", "1", "--max-tokens", "64", "--out", str(out)]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    path = out / "records.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= 20:
            break
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    killed = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert killed, "the run finished before it could be killed; raise --limit"
    n_before = len(read_records(path))
    assert 20 <= n_before < 300
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    recs = read_records(path)
    assert len(recs) == 300 and len({r.request_id for r in recs}) == 300


def test_paper_prompt_plan_per_strategy(tmp_path):
    """--prompt-variants paper: 3 x 3 for InWriting and NL-to-Format, 3 x 1 for JSON (paper 003 A.2), and
    InWriting and NL-to-Format answer in the JSON form (the paper's target after section 5.2) unless :plain."""
    import collections
    import json as _json

    from formtax.errors import ConfigError
    from formtax.runner import RunConfig, run
    from formtax.runner.config import paper_variants

    cfg = RunConfig(task="arith", strategies=["json@vc", "inwriting@vc", "nl2format@vc", "nl2format@none:plain"],
                    backend="fake", limit=2, max_tokens=96, prompt_variants="paper")
    run(cfg, tmp_path / "r")
    recs = [_json.loads(x) for x in (tmp_path / "r" / "records.jsonl").read_text().splitlines()]
    variants = collections.defaultdict(set)
    formats = collections.defaultdict(set)
    for r in recs:
        variants[r["strategy"]].add(r["prompt_variant"])
        formats[r["strategy"]].add(r["output_format"])
    assert variants["json@vc"] == {"t1f1", "t2f1", "t3f1"}
    assert len(variants["inwriting@vc:json"]) == 9 and len(variants["nl2format@vc:json"]) == 9
    assert formats["inwriting@vc:json"] == formats["nl2format@vc:json"] == {"reason-json"}
    assert formats["nl2format@none:plain"] == {"reason-answer"}
    assert paper_variants("aime", "inwriting") == [(1, 1), (1, 2), (1, 3)]
    with pytest.raises(ConfigError, match="paper 003 runs"):
        run(RunConfig(task="arith", strategies=["free"], backend="fake", limit=1, prompt_variants="paper"),
            tmp_path / "bad")
    with pytest.raises(ConfigError, match="same strategy"):
        run(RunConfig(task="arith", strategies=["inwriting", "inwriting:json"], backend="fake", limit=1,
                      prompt_variants="paper"), tmp_path / "dup")


def test_nl2format_extractor_model_writes_the_second_call(tmp_path):
    """--extractor-model: call 2 on another model (paper 003 uses a larger one); records name both models."""
    import json as _json

    from formtax.errors import ConfigError
    from formtax.runner import RunConfig, run

    cfg = RunConfig(task="arith", strategies=["nl2format@vc", "free"], backend="fake", model="1", limit=3,
                    max_tokens=48, extractor_model="7")
    run(cfg, tmp_path / "r")
    recs = [_json.loads(x) for x in (tmp_path / "r" / "records.jsonl").read_text().splitlines()]
    nl = [r for r in recs if r["strategy"] == "nl2format@vc"]
    assert nl and all(r["model"] == "fake-random-1" and r["stats"]["extractor"] == "fake-random-7" for r in nl)
    manifest = _json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["backend"]["extractor"]["model"] == "fake-random-7"
    same = RunConfig(task="arith", strategies=["nl2format@vc"], backend="fake", model="1", limit=3, max_tokens=48)
    run(same, tmp_path / "s")
    first = [_json.loads(x) for x in (tmp_path / "s" / "records.jsonl").read_text().splitlines()]
    assert {r["stats"]["extractor"] for r in first} == {"fake-random-1"}
    assert [r["reasoning"] for r in first] == [r["reasoning"] for r in nl]  # call 1 is the same model's
    with pytest.raises(ConfigError, match="applies to nl2format"):
        run(RunConfig(task="arith", strategies=["free"], backend="fake", limit=1, extractor_model="7"),
            tmp_path / "bad")


def test_a_locked_run_directory_refuses_a_second_run(tmp_path):
    """Two runs into one --out used to both append every record; the second is now refused, told who holds it."""
    import subprocess
    import sys
    import textwrap

    from formtax.errors import ConfigError
    from formtax.runner import RunConfig, run

    out = tmp_path / "r"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from formtax.runner.run import run_lock
        with run_lock(Path({str(out)!r})):
            print("locked", flush=True)
            time.sleep(30)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        cfg = RunConfig(task="arith", strategies=["free"], backend="fake", limit=2, max_tokens=8)
        with pytest.raises(ConfigError, match=f"in use by another formtax run \\(pid {holder.pid} "):
            run(cfg, out)
        assert not (out / "records.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()
    assert run(RunConfig(task="arith", strategies=["free"], backend="fake", limit=2, max_tokens=8), out).done == 2


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"batch_size": 0}, "--batch-size must be at least 1"),
    ({"batch_size": -1}, "--batch-size must be at least 1"),
    ({"limit": 0}, "--limit must be at least 1"),
])
def test_bad_run_settings_are_refused_before_anything_is_written(tmp_path, kwargs, message):
    from formtax.errors import ConfigError
    from formtax.runner import RunConfig, run

    cfg = RunConfig(task="arith", strategies=["free"], backend="fake", max_tokens=8, **{"limit": 2, **kwargs})
    with pytest.raises(ConfigError, match=message):
        run(cfg, tmp_path / "r")
    assert not (tmp_path / "r").exists()
    afile = tmp_path / "f.txt"
    afile.write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        run(RunConfig(task="arith", strategies=["free"], backend="fake", limit=1, max_tokens=8), afile)


def test_every_request_samples_from_its_own_seed():
    """The default seeding gives each (item, strategy, variant, seed index) its own sampler seed, so requests are
    independent draws (what the statistics assume); ``index`` keeps the older shared seed index."""
    from formtax.runner.execute import request_for, sampler_seed
    from formtax.runner.grid import plan_grid
    from formtax.tasks import get_task, sample_items

    task = get_task("arith")
    items = sample_items(task.load(None), 4, 0)
    specs = [parse_strategy_spec(s) for s in ("free", "constrained")]
    planned = plan_grid(task, items, specs, lambda s: [(1, 1)], [0, 1], 0)
    config = cfg(temperature=1.0, closing=False)  # a run settles closing before it plans (run_closing)
    seeds = [request_for(task, p, config).seed for p in planned]
    assert len(set(seeds)) == len(planned) == 16
    assert seeds == [request_for(task, p, config).seed for p in planned]  # reproducible
    assert all(0 <= s < 2**63 for s in seeds)
    assert [sampler_seed(p, "index") for p in planned] == [p.seed for p in planned]
    with pytest.raises(ConfigError, match="seeding"):
        sampler_seed(planned[0], "shared")


def test_seeding_is_part_of_a_sampled_runs_identity_only():
    assert "seeding" not in cfg().identity()  # greedy decoding reads no seed: older greedy runs still resume
    assert cfg(temperature=1.0).identity()["seeding"] == "request"
    assert "seeding" not in cfg(temperature=1.0, seeding="index").identity()  # what runs before it recorded


def _records_path(out):
    return out / "records.jsonl"


@pytest.mark.parametrize("damage", ["duplicate", "edited_id", "edited_item", "other_budget", "other_sampling",
                                    "other_model"])
def test_resume_checks_the_records_it_adopts(tmp_path, damage):
    from formtax.errors import DataError

    out = tmp_path / "r"
    run(cfg(strategies=["free", "constrained"], limit=2, seeds=1), out, backend=FakeBackend(random_logits(seed=0)))
    lines = _records_path(out).read_text().splitlines(keepends=True)
    rec = json.loads(lines[0])
    if damage == "duplicate":
        lines.append(lines[0])
    elif damage == "edited_id":
        rec["request_id"] = "0" * len(rec["request_id"])
        lines[0] = json.dumps(rec) + "\n"
    elif damage == "edited_item":
        other = json.loads(lines[1])
        rec["item_id"] = other["item_id"] if other["item_id"] != rec["item_id"] else rec["item_id"] + "x"
        lines[0] = json.dumps(rec) + "\n"
    _records_path(out).write_text("".join(lines))
    config = cfg(strategies=["free", "constrained"], limit=2, seeds=1)
    if damage == "other_budget":  # the manifest deleted, then a run with other settings over the old records
        (out / "manifest.json").unlink()
        config = cfg(strategies=["free", "constrained"], limit=2, seeds=1, max_tokens=64)
    if damage in ("other_sampling", "other_model"):  # the same budget: only the record's run identity differs
        (out / "manifest.json").unlink()
        config = (cfg(strategies=["free", "constrained"], limit=2, seeds=1, temperature=0.7)
                  if damage == "other_sampling" else
                  cfg(strategies=["free", "constrained"], limit=2, seeds=1, model="another-model"))
    with pytest.raises(DataError, match="record"):
        run(config, out, backend=FakeBackend(random_logits(seed=0)))


def test_verify_checks_the_manifest_against_the_records(tmp_path):
    from formtax.report import write_report
    from formtax.report.verify import verify_report

    out = tmp_path / "r"
    run(cfg(strategies=["free", "constrained"], limit=2, seeds=1), out, backend=FakeBackend(random_logits(seed=0)))
    write_report(out)
    assert verify_report(out) == []
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["config_identity"]["max_tokens"] = 999  # a hand-edited manifest
    manifest["items"] = manifest["items"][:1]
    (out / "manifest.json").write_text(json.dumps(manifest))
    problems = verify_report(out)
    assert any("other settings than manifest.json names" in p for p in problems)
    assert any("is not among the manifest's items" in p for p in problems)
