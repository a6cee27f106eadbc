"""The memory-hygiene measurements (``gpubench.diagnostics.hygiene``) on a tiny model, and the
memory command
that records them (``emptycache`` in its OOM frontier, the verdicts in ``memory.md``)."""

from __future__ import annotations

import json

import pytest

from gpubench.cli import main as cli
from gpubench.cli.memory import TECHNIQUES, technique_config
from gpubench.diagnostics import hygiene
from gpubench.suite.cases import baseline


@pytest.fixture(scope="module")
def tiny():
    return hygiene.setup("bert", "smoke")


def test_no_grad_and_inference_mode_save_nothing_for_backward(tiny):
    grad = hygiene.evaluation(tiny, "grad")
    assert grad.saved_bytes > 0 and grad.held_saved_bytes == grad.saved_bytes
    for mode in ("no_grad", "inference_mode"):
        m = hygiene.evaluation(tiny, mode)
        assert m.saved_bytes == 0 and m.held_saved_bytes == 0, mode
        assert m.peak_bytes is None  # the CPU: exact saved bytes only
    assert tiny.module.training  # evaluation() puts the model back in training mode
    with pytest.raises(ValueError, match="mode must be one of"):
        hygiene.evaluation(tiny, "eval")


def test_a_kept_intermediate_holds_its_graph_and_del_frees_it(tiny):
    kept, deleted = hygiene.kept_graph(tiny, True), hygiene.kept_graph(tiny, False)
    # Both loops save the same bytes; the kept loss (a scalar) holds its forward's saved
    # activations through the next step, nearly doubling what is held at once.
    assert kept.saved_bytes == pytest.approx(deleted.saved_bytes, rel=0.1)
    assert kept.held_saved_bytes > 1.5 * deleted.held_saved_bytes > 0
    assert 0 < kept.kept_bytes <= 8 and deleted.kept_bytes == 0


def test_outputs_kept_after_backward_hold_only_their_own_storage(tiny):
    kept, deleted = hygiene.kept_outputs(tiny, True), hygiene.kept_outputs(tiny, False)
    # backward() already freed the graph: the saved bytes held are the same, the outputs
    # (the logits and the loss) are what the kept loop holds more.
    assert kept.held_saved_bytes == deleted.held_saved_bytes > 0
    logits = tiny.micro_batch * 10 * 4  # the smoke BERT's 10 classes, fp32
    assert kept.kept_bytes >= logits and deleted.kept_bytes == 0
    assert kept.held_bytes > deleted.held_bytes


def test_measure_is_plain_data_the_advice_judges():
    from gpubench.analysis.advice import memory_verdicts
    from gpubench.suite.claims import CLAIMS

    data = hygiene.measure("bert", "smoke")
    json.dumps(data)  # memory.json
    assert data["evaluation"]["no_grad"]["saved_bytes"] == 0
    verdicts = {v.claim: v.verdict for v in memory_verdicts(
        {"model": "bert", "device": "cpu", "frontier": [], "hygiene": data})}
    assert verdicts[CLAIMS["no-grad"].text] == "holds"
    assert verdicts[CLAIMS["del"].text] in ("holds", "partly holds (graph)")


def test_the_frontier_takes_the_emptycache_technique():
    parser = cli.build_parser()
    args = parser.parse_args(["memory", "--model", "bert", "--techniques", "fp32, emptycache"])
    assert args.techniques == "fp32,emptycache"
    cfg = technique_config(baseline("bert", "smoke", "cuda"), "emptycache")
    assert cfg.empty_cache and cfg.id == "bert-fp32-emptycache"
    assert TECHNIQUES["emptycache"] == {"empty_cache": True}


def test_a_bad_technique_is_a_one_line_error_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["memory", "--model", "bert", "--techniques", "fp32,emptycash"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "emptycash" in err and "emptycache" in err


def test_memory_report_records_hygiene_and_verdicts(monkeypatch, tmp_path, capsys):
    import gpubench.diagnostics.frontier
    import gpubench.diagnostics.leaks
    from gpubench.diagnostics.frontier import Frontier, Try

    monkeypatch.setattr(gpubench.diagnostics.frontier, "find_frontier",
                        lambda cfg, budget, limit: Frontier(cfg.id, 8, [Try(8, True, 100)]))
    monkeypatch.setattr(gpubench.diagnostics.leaks, "allocator_stats", lambda device: {
        "reserved_bytes": None})
    assert cli.main(["memory", "--model", "bert", "--profile", "smoke", "--device", "cpu",
                     "--techniques", "fp32,emptycache", "--budget", "2G", "--no-leaks",
                     "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "memory.json").read_text())
    assert [f["technique"] for f in report["frontier"]] == ["fp32", "emptycache"]
    assert report["hygiene"]["evaluation"]["grad"]["saved_bytes"] > 0
    text = (tmp_path / "memory.md").read_text()
    assert "## Memory hygiene of the loop" in text and "## Verdicts on the memory claims" in text
    assert "not testable here" in text  # empty_cache on the CPU

    # gpubench advise reads a memory.json beside the results (or --memory).
    from gpubench.analysis.results import ResultsError
    from gpubench.report.memory import load_memory_reports

    args = cli.build_parser().parse_args(["advise", "--results", str(tmp_path / "b.json")])
    assert cli.memory_reports(args, [tmp_path / "b.json"])[0]["model"] == "bert"
    (tmp_path / "bad.json").write_text("[1]")
    with pytest.raises(ResultsError, match="not a gpubench memory.json"):
        load_memory_reports([tmp_path / "bad.json"])


def test_a_run_keeps_its_childs_hygiene_and_measures_only_the_models_it_lacks(tmp_path,
                                                                              monkeypatch):
    """``gpubench run``'s pytest child measures no_grad / del after its cases (its models'
    libraries are loaded there); the parent measures only what the child left out (a child
    stopped early, the cases a resumed run kept), and drops reports of models not in the run."""
    from gpubench.cli import memory

    child = [{"model": "bert", "hygiene": {"from": "child"}},
             {"model": "gone", "hygiene": {"from": "child"}}]
    (tmp_path / memory.HYGIENE_FILE).write_text(json.dumps(child))
    measured = []

    def here(models, profile, device):
        measured.append(dict(models))
        return [{"model": m, "hygiene": {"from": "parent"}} for m in models]

    monkeypatch.setattr(memory, "hygiene_reports", here)
    reports = memory.run_hygiene({"bert": "bert", "gpt2": "gpt2"}, tmp_path, "smoke", "cpu")
    assert [(r["model"], r["hygiene"]["from"]) for r in reports] == [
        ("bert", "child"), ("gpt2", "parent")]
    assert measured == [{"gpt2": "gpt2"}]
    assert not (tmp_path / memory.HYGIENE_FILE).exists()  # taken: a resumed run does not reread it
    # no file from the child (killed before it measured): every model is measured here
    assert [r["model"] for r in memory.run_hygiene({"bert": "bert"}, tmp_path, "smoke", "cpu")] \
        == ["bert"] and measured[-1] == {"bert": "bert"}


@pytest.mark.slow
def test_the_benchmark_session_measures_the_hygiene_of_the_models_that_ran(tmp_path):
    """The pytest plugin's ``--gpubench-hygiene FILE``: the reports of the models whose cases
    passed in the session (bert's; resnet18's cases were deselected), as ``gpubench run``'s
    memory.json holds them."""
    import subprocess
    import sys

    from gpubench.cli.main import find_benchmarks_dir

    out = tmp_path / "hygiene.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"{find_benchmarks_dir() / 'test_training_step.py'}::test_step[bert-fp32]",
         "--gpubench-profile=smoke", "--gpubench-device=cpu", "--gpubench-models=resnet18,bert",
         "--gpubench-rounds=3", "--benchmark-disable", f"--gpubench-hygiene={out}"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    reports = json.loads(out.read_text())
    assert [r["model"] for r in reports] == ["bert"]
    assert reports[0]["hygiene"]["evaluation"]["grad"]["saved_bytes"] > 0


def test_a_hygiene_file_it_cannot_write_is_one_warning_not_a_failed_session(tmp_path, capsys,
                                                                           monkeypatch):
    """The plugin's session end: where ``--gpubench-hygiene FILE`` cannot be written (a file
    where its folder should be, a full disk), one warning line, and the session's outcome stands
    (``gpubench run`` then measures the models itself)."""
    import importlib.util
    from types import SimpleNamespace

    from gpubench.cli import memory
    from gpubench.cli.main import find_benchmarks_dir

    spec = importlib.util.spec_from_file_location("benchmarks_conftest",
                                                  find_benchmarks_dir() / "conftest.py")
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    monkeypatch.setattr(memory, "hygiene_reports", lambda models, p, d: [{"model": "bert"}])
    case = SimpleNamespace(cfg=SimpleNamespace(name="bert"))
    opts = SimpleNamespace(cases={"bert-fp32": case}, model_names=("bert",), models=("bert",),
                           profile="smoke", device="cpu", ran={"bert-fp32"})
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the folder should be")
    path = blocked / "hygiene.json"
    config = SimpleNamespace(gpubench=opts, getoption=lambda name, default=None: str(path))
    session = SimpleNamespace(config=config, shouldstop=False, shouldfail=False)
    plugin.pytest_sessionfinish(session, pytest.ExitCode.OK)  # no exception
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpubench: warning: cannot write the no_grad/del")
    assert blocked.is_file()
    blocked.unlink()
    plugin.pytest_sessionfinish(session, pytest.ExitCode.OK)
    assert json.loads(path.read_text()) == [{"model": "bert"}]
    path.unlink()
    plugin.pytest_sessionfinish(session, pytest.ExitCode.INTERRUPTED)  # left to the parent
    assert not path.exists()
