"""bench/gpu.py runs on CPU (issue 35): the tiny config through the device path, with the default model's tokenizer.

It checks what the benchmark itself reports: formtax free decoding token-identical to transformers ``generate``,
every constrained mode parsing, and a summary line with the ratios the issue's targets name.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "bench" / "gpu.py"


@pytest.mark.model
def test_gpu_bench_runs_on_cpu_through_the_device_path():
    out = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--quick", "--device-step",
                          "--batches", "3", "--tokens", "40", "--threads", "1"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    (row,) = [x for x in lines if x.get("event") == "batch"]
    assert row["free_identical"] == "3/3"
    for mode in ("json", "json_noclosing", "inwriting", "suffix_last"):
        assert row[f"{mode}_parse_ok"] == "3/3", mode
        assert row[f"{mode}_tok_s"] > 0
    summary = lines[-1]
    assert summary["bench"] == "gpu" and summary["better"] == "higher"
    assert set(summary["tiny_b3"]) >= {"json_over_free", "inwriting_over_free", "suffix_last_over_free",
                                       "json_over_plain_llguidance", "free_identical"}
