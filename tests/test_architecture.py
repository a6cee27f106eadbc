"""The package's shape: layer folders that import only the folders below them, and no import
circles in any folder (the import-linter contracts in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))"]


def _lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(LINT, cwd=root, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


def test_the_architecture_contract_is_kept():
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 kept, 0 broken" in done.stdout


@pytest.mark.parametrize("module, line, broken", [
    ("util/atomic.py", "from gpubench.cli import main", "gpubench.util is not allowed to import"),
    ("util/tables.py", "from gpubench.util import atomic\nfrom gpubench.util.atomic import "
     "_x_probe", "No cycles are allowed in gpubench.util"),
])
def test_the_contract_catches_an_upward_import_and_a_circle(tmp_path, module, line, broken):
    """A copy of the package with one import added, inside a function (where the CLI's lazy
    imports are): the contract names what broke."""
    shutil.copytree(ROOT / "gpubench", tmp_path / "gpubench",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    body = "".join(f"    {ln}\n" for ln in line.splitlines())
    with open(tmp_path / "gpubench" / module, "a") as f:
        f.write(f"\n\ndef _x_probe():\n{body}    return None\n")
    if "tables" in module:  # the circle's other half: atomic imports tables
        with open(tmp_path / "gpubench" / "util" / "atomic.py", "a") as f:
            f.write("\n\ndef _x_probe():\n    from gpubench.util import tables\n"
                    "    return tables\n")
    done = _lint(tmp_path)
    assert done.returncode == 1 and broken in done.stdout, done.stdout[-3000:]
