"""The library installs next to the user's torch (issue 36, point 3).

The dependency is a range that admits the torch builds users run (the GPU machine's 2.11, this machine's 2.13, CUDA
local versions): an exact pin would make pip replace a user's CUDA torch with a CPU build. The exact pin this
machine needs lives in scripts/env.sh, which installs torch before the project. The licence is an SPDX string
(setuptools deprecates the table form and warned on every install).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _torch() -> Requirement:
    (req,) = [r for r in map(Requirement, PROJECT["dependencies"]) if r.name == "torch"]
    return req


def test_torch_is_a_range_that_keeps_the_users_build():
    spec = _torch().specifier
    assert not any(s.operator in ("==", "===") for s in spec), f"torch is pinned: {spec}"
    for version in ("2.11.0", "2.13.0", "2.13.0+cpu", "2.11.0+cu126", "3.0.0"):
        assert spec.contains(version, prereleases=False), version


def test_the_exact_pin_lives_in_the_scripts():
    assert '"torch==2.13.0"' in (ROOT / "scripts" / "env.sh").read_text()


def test_the_licence_is_an_spdx_string():
    assert PROJECT["license"] == "Apache-2.0"
