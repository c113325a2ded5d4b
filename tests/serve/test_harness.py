"""An OpenAI-speaking evaluation harness as a client of ``formtax serve`` (issue 39, point 7): inspect_ai's
``openai-api`` provider runs a two-sample task against a live server whose default strategy and answer
(``--strategy inwriting --answer ...``) apply to requests that carry no formtax fields. inspect_ai lives in its own
venv (scripts/env-harness.sh); the test skips where FORMTAX_HARNESS_PYTHON does not name it."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")

from formtax.backends.fake import FakeBackend, random_logits  # noqa: E402
from formtax.serve.app import ServerThread, create_app  # noqa: E402

HARNESS = os.environ.get("FORMTAX_HARNESS_PYTHON")

TASK = '''
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import generate


@task
def arith():
    return Task(dataset=[Sample(input="What is 3 plus 4?", target="7"), Sample(input="What is 9 minus 7?", target="2")],
                solver=generate(), scorer=includes())
'''

READ = '''
import glob, json, sys
from inspect_ai.log import read_eval_log
log = read_eval_log(sorted(glob.glob(sys.argv[1] + "/*.eval"))[-1])
out = []
for s in log.samples:
    parts = s.output.choices[0].message.content
    reasoning = [p.reasoning for p in parts if getattr(p, "type", "") == "reasoning"] if isinstance(parts, list) else []
    out.append({"completion": s.output.completion, "reasoning": reasoning, "score": str(s.scores)})
print(json.dumps({"status": log.status, "samples": out}))
'''


@pytest.mark.skipif(not HARNESS, reason="no harness venv (scripts/env-harness.sh sets FORMTAX_HARNESS_PYTHON)")
def test_inspect_ai_runs_against_the_server_defaults(tmp_path: Path) -> None:
    assert HARNESS is not None
    app = create_app(FakeBackend(random_logits(seed=5)), window_s=0.0, temperature=0.0, strategy="inwriting",
                     answer="The answer is: {int}", served_model_names=("smol",))
    (tmp_path / "task.py").write_text(TASK)
    (tmp_path / "read.py").write_text(READ)
    inspect = str(Path(HARNESS).parent / "inspect")
    with ServerThread(app) as srv:
        env = {**os.environ, "FORMTAX_BASE_URL": srv.url, "FORMTAX_API_KEY": "none", "INSPECT_DISPLAY": "none"}
        run = subprocess.run([inspect, "eval", "task.py", "--model", "openai-api/formtax/smol", "--max-tokens", "60",
                              "--log-dir", str(tmp_path / "logs")], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    read = subprocess.run([HARNESS, "read.py", str(tmp_path / "logs")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert read.returncode == 0, read.stderr[-2000:]
    got = json.loads(read.stdout.strip().splitlines()[-1])
    assert got["status"] == "success" and len(got["samples"]) == 2
    for s in got["samples"]:  # the server's default strategy: reasoning apart, the answer in its format
        assert re.fullmatch(r"The answer is: -?\d+", s["completion"]), s
        assert s["reasoning"] and s["reasoning"][0], s
