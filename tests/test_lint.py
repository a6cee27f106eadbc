"""The code's style: ruff's rules as pyproject.toml selects them, and pycodestyle's blank-line
rules, which ruff still counts as preview rules (selected by name here, so that preview's other
changes stay off)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("extra", [[], ["--preview", "--select", "E301,E302,E303,E305"]],
                         ids=["configured", "blank-lines"])
def test_ruff_finds_nothing(extra):
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *extra, "."],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
