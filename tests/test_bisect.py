"""``gpubench bisect``: the first slow commit of a scratch repository whose workload file's step
sleeps longer from one commit on."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from gpubench.cli.bisect import bisect, commits_between, git
from gpubench.cli.main import main

WORKLOAD = '''
import time

import torch
import torch.nn.functional as F
from torch import nn

from gpubench import Workload

SLEEP_S = {sleep}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        time.sleep(SLEEP_S)
        return self.fc(x)


def workload(profile="cpu"):
    return Workload(name="sleepy", build_model=Net, micro_batch=4, loss_fn=F.cross_entropy,
                    make_batch=lambda n, g: (torch.randn(n, 8, generator=g),
                                             torch.randint(0, 2, (n,), generator=g)))
'''


def scratch_repo(root: Path, sleeps: list[float]) -> list[str]:
    """A repository with one commit per sleep (``workload.py``'s step sleeps that long)."""
    root.mkdir()
    run = lambda *a: subprocess.run(["git", "-C", str(root), *a], check=True,  # noqa: E731
                                    capture_output=True)
    run("init", "-q")
    run("config", "user.email", "t@example.com")
    run("config", "user.name", "t")
    for i, sleep in enumerate(sleeps):
        (root / "workload.py").write_text(WORKLOAD.format(sleep=sleep))
        (root / "notes.txt").write_text(f"change {i}\n")
        run("add", "-A")
        run("commit", "-q", "-m", f"change {i}: sleep {sleep}")
    return git(root, "rev-list", "--reverse", "HEAD").split()


def test_binary_search_finds_the_first_slow_commit_measuring_few(tmp_path):
    sleeps = [0.01] * 6 + [0.013] * 6  # 30% slower from commit 6 on
    ids = scratch_repo(tmp_path / "repo", sleeps)
    commits = commits_between(tmp_path / "repo", ids[0], ids[-1])
    assert commits == ids
    rng = np.random.default_rng(0)
    measured = []

    def measure(commit):
        measured.append(commit)
        return list(sleeps[ids.index(commit)] * np.exp(rng.normal(0, 0.02, 8)))

    result = bisect(commits, measure)
    assert result.first_bad == ids[6]
    assert len(measured) <= 2 + 4  # the two ends and log2(11) commits between
    assert result.verdicts[ids[5]] == "good" and result.verdicts[ids[6]] == "bad"


def test_nothing_to_bisect_when_the_ends_measure_alike(tmp_path):
    ids = scratch_repo(tmp_path / "repo", [0.01] * 3)
    rng = np.random.default_rng(1)
    result = bisect(ids, lambda c: list(0.01 * np.exp(rng.normal(0, 0.02, 8))))
    assert result.first_bad is None and "nothing to bisect" in result.note


def test_bad_commits_are_one_line_errors(tmp_path, capsys):
    ids = scratch_repo(tmp_path / "repo", [0.01, 0.02])
    assert main(["bisect", ids[1], ids[0], "--case", "x", "--repo",
                 str(tmp_path / "repo")]) == 2
    assert "is not an ancestor" in capsys.readouterr().err
    assert main(["bisect", "nosuch", ids[1], "--case", "x", "--repo",
                 str(tmp_path / "repo")]) == 2
    assert "nosuch" in capsys.readouterr().err


@pytest.mark.slow
def test_bisect_end_to_end_in_worktrees(tmp_path, capsys, monkeypatch):
    """The real thing: a worktree per commit, gpubench run of the case in it."""
    repo = tmp_path / "repo"
    # One commit between GOOD and BAD: three worktrees, each measured once (the search itself
    # is tested above on simulated measurements).
    ids = scratch_repo(repo, [0.001, 0.05, 0.05])
    monkeypatch.chdir(repo)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    code = main(["bisect", ids[0], ids[-1], "--case", "sleepy-fp32", "--model",
                 "workload.py:workload", "--profile", "cpu",
                 "--run-args", "--rounds 8 --warmup 1", "--install", "touch installed"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"first bad commit: {ids[1]}" in out
    assert "change 1: sleep 0.05" in out
    assert git(repo, "worktree", "list").count("\n") == 0  # worktrees removed
