"""Adding a technique touches its declaration and its implementation object, nothing else: a copy
of the package with one no-op technique added that way shows it in the case id, ``gpubench case
--help``, ``gpubench list``, the memory frontier's choices, a measured record and the results
frame, and its implementation's hook ran inside the measured step."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

DECLARATION = '''    Technique(
        "noop", "bool", default=False, tag="noop", counted=False,
        help="A technique that does nothing, added by a test.",
        implementation="gpubench.train.implementations:NoOp",
        group="memory", cases=lambda base: [base.with_(noop=True)],
        variants=(Variant("noop", {"noop": True}, "does nothing", ("frontier",)),)),
'''

IMPLEMENTATION = '''

class NoOp(Implementation):
    """Counts the micro-batches whose forward and backward it surrounded."""

    def forward(self):
        import contextlib
        import os

        with open(os.environ["NOOP_MARKS"], "a") as marks:
            marks.write("forward\\n")
        return contextlib.nullcontext()
'''


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("added")
    shutil.copytree(ROOT / "gpubench", root / "gpubench",
                    ignore=shutil.ignore_patterns("__pycache__"))
    techniques = root / "gpubench" / "train" / "techniques.py"
    text = techniques.read_text()
    anchor = "    # How batches reach the step (LoaderConfig).\n"
    assert text.count(anchor) == 1
    techniques.write_text(text.replace(anchor, DECLARATION + anchor))
    with open(root / "gpubench" / "train" / "implementations.py", "a") as f:
        f.write(IMPLEMENTATION)
    return root


def _run(package: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(package), "COLUMNS": "200", **env}
    done = subprocess.run([sys.executable, *args], cwd=package, env=environ,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def test_the_copy_is_the_package_under_test(package):
    done = _run(package, "-c", "import gpubench; print(gpubench.__file__)")
    assert done.stdout.strip() == str(package / "gpubench" / "__init__.py")


@pytest.mark.slow
def test_a_declared_technique_is_a_flag_a_case_and_a_frontier_choice(package):
    help_text = _run(package, "-m", "gpubench", "case", "--help").stdout
    assert "--noop, --no-noop" in help_text and "A technique that does nothing" in help_text
    listed = _run(package, "-m", "gpubench", "list", "--profile", "cpu", "--model", "resnet18",
                  "--groups", "memory").stdout
    assert "resnet18-fp32-noop" in listed.split()
    assert "noop" in _run(package, "-m", "gpubench", "memory", "--help").stdout


@pytest.mark.slow
def test_a_declared_technique_is_measured_recorded_and_typed(package, tmp_path):
    marks = tmp_path / "marks"
    out = tmp_path / "noop.json"
    _run(package, "-m", "gpubench", "case", "--model", "resnet18", "--profile", "smoke",
         "--noop", "--rounds", "2", "--warmup", "1", "-o", str(out), NOOP_MARKS=str(marks))
    (bench,) = json.loads(out.read_text())["benchmarks"]
    assert bench["extra_info"]["case_id"] == "resnet18-fp32-noop"
    assert bench["extra_info"]["noop"] is True
    assert bench["extra_info"]["check_grad_cosine"] > 0.99  # the training check ran, passed
    # The hook surrounded the micro-batches of the check, the warm-up and the timed rounds.
    assert len(marks.read_text().splitlines()) >= 3
    frame = _run(package, "-c", "import sys; from gpubench.analysis.results import "
                 "load_results; df = load_results([sys.argv[1]]); "
                 "print(df['noop'].dtype, df['empty_cache'].dtype, bool(df['noop'].iloc[0]))",
                 str(out)).stdout
    assert frame.split() == ["boolean", "boolean", "True"]  # typed as every bool technique
