"""The CLI answers at once and refuses bad input in one line: ``--help``, ``ls`` and argument errors load no torch,
transformers or llguidance; the strategy catalog (what ``ls`` reads) equals the registry; every bad value named in
the UX issue is one ``formtax: error:`` line with exit status 2, before any model loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from formtax.cli.main import main

HEAVY = ("torch", "transformers", "llguidance.torch")


def _modules_after(code: str) -> set[str]:
    probe = f"import sys\n{code}\nprint('MODULES=' + ','.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    line = next(x for x in out.stdout.splitlines() if x.startswith("MODULES="))
    return set(line[len("MODULES="):].split(","))


@pytest.mark.parametrize("argv", [["--help"], ["ls", "strategies"], ["ls", "tasks"], ["run", "--help"],
                                  ["generate", "--help"], ["--version"]])
def test_help_and_ls_load_no_heavy_module(argv: list[str]) -> None:
    code = ("from formtax.cli.main import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass")
    loaded = _modules_after(code)
    assert not [m for m in HEAVY if m in loaded], [m for m in HEAVY if m in loaded]


def test_import_formtax_is_light_and_lazy() -> None:
    loaded = _modules_after("import formtax")
    assert "torch" not in loaded
    import formtax

    assert callable(formtax.generate) and "generate" in dir(formtax)
    with pytest.raises(AttributeError):
        formtax.no_such_name  # noqa: B018


def test_catalog_equals_registry() -> None:
    from formtax.strategies import list_strategies
    from formtax.strategies.base import _REGISTRY
    from formtax.strategies.catalog import CATALOG, list_catalog

    assert list_catalog() == list_strategies()
    assert {n: (c.__module__, c.summary) for n, c in _REGISTRY.items()} == CATALOG


def test_version_and_defaults_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    import formtax

    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"formtax {formtax.__version__}"
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("(default 256)", "(default: 8)", "(default: t1f1)", "(default: 1)"):
        assert shown in text, shown


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("formtax: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--limit", "0", "--limit must be at least 1"),
    ("--batch-size", "0", "--batch-size must be at least 1"),
    ("--seeds", "0", "--seeds must be at least 1"),
    ("--max-tokens", "0", "--max-tokens must be at least 1"),
    ("--workers", "0", "--workers must be at least 1"),
    ("--temperature", "-1", "temperature must be a finite number >= 0"),
    ("--model", "/no/such/model", "--model /no/such/model: no such file or folder"),
    ("--model", "./missing.gguf", "no such file or folder"),
])
def test_run_refuses_bad_values_in_one_line(flag: str, value: str, message: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["run", "--task", "arith", "--strategies", "free", flag, value, "--out", str(tmp_path / "o")],
                 capsys)
    assert message in err
    assert not (tmp_path / "o" / "records.jsonl").exists()


def test_generate_refuses_a_missing_model_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert "no such file or folder" in _error(["generate", "--model", "/no/such/dir", "hi"], capsys)


def test_report_and_verify_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from formtax.runner import RunConfig, run

    run(RunConfig(task="arith", strategies=["free"], backend="fake", limit=2), tmp_path)
    assert "--replicates must be at least 1" in _error(["report", str(tmp_path), "--replicates", "0"], capsys)
    err = _error(["verify", str(tmp_path)], capsys)
    assert f"run `formtax report {tmp_path}` first" in err
    assert "no records.jsonl" in _error(["verify", str(tmp_path / "nothing")], capsys)


def test_interrupted_run_says_how_to_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import formtax.runner as runner

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run", interrupted)
    assert main(["run", "--task", "arith", "--strategies", "free", "--backend", "fake",
                 "--out", str(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "Run the same command again to resume" in err


def test_data_dir_found_from_another_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from formtax.tasks.base import DATA_ENV_VAR, project_root, resolve_data_dir

    root = project_root()
    if root is None or not (root / ".." / "shared" / "data").is_dir():
        pytest.skip("no shared/data beside this checkout")
    monkeypatch.delenv(DATA_ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    assert resolve_data_dir(None) == (root / ".." / "shared" / "data").resolve()
    assert json.dumps(str(resolve_data_dir(None)))


@pytest.mark.parametrize("argv", [["generate", "--threads", "0", "hi"],
                                  ["run", "--task", "arith", "--strategies", "free", "--threads", "0", "--out",
                                   "/tmp/formtax-threads-refused"],
                                  ["serve", "--threads", "0"]])
def test_threads_is_an_option_of_generate_run_and_serve(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert "--threads must be at least 1, got 0" in _error(argv, capsys)


def test_threads_sets_torchs_threads() -> None:
    import argparse

    import torch

    from formtax.cli.generate import apply_threads

    before = torch.get_num_threads()
    try:
        apply_threads(argparse.Namespace(threads=1))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_an_answer_the_strategy_does_not_enforce_says_so() -> None:
    import formtax
    from formtax.backends.fake import FakeBackend, scripted

    r = formtax.generate(FakeBackend(scripted("It is 42.")), "q", "free", int, max_tokens=20)
    assert r.parsed == 42 and r.stats["answer_constrained"] is False
    r = formtax.generate(FakeBackend(scripted("42")), "q", "constrained", int, max_tokens=20)
    assert r.stats["answer_constrained"] is True
