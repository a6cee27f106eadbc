"""pytest-benchmark wiring: options that choose the cases, and the machine info of every run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from gpubench.cli.options import add_session_arguments, resolve_target
from gpubench.launchers.workers import DEFAULT_TIMEOUT_S, preload_workload_imports
from gpubench.measure.machine import machine_info as describe_machine
from gpubench.measure.runner import forked_imports
from gpubench.measure.version import SCHEMA_VERSION
from gpubench.suite.cases import GROUPS, PROFILE_MODELS, profile_cases
from gpubench.train.config import GENERATED_DATASETS
from gpubench.workloads.api import WorkloadError, set_probe_timeout
from gpubench.workloads.datasets import default_data_dir
from gpubench.workloads.profiles import profile
from gpubench.workloads.registry import builtin_names, checked, resolve


def pytest_addoption(parser):
    group = parser.getgroup("gpubench")
    add_session_arguments(group.addoption, pytest=True)
    group.addoption("--gpubench-models", default="",
                    help="comma-separated workloads: built-in names "
                    f"({', '.join(builtin_names())}), FILE.py:FACTORY, MODULE:FACTORY, "
                    "torchvision:NAME, timm:NAME, transformers:TYPE "
                    "(default: the profile's built-in models)")
    group.addoption("--gpubench-trace", default="", metavar="DIR",
                    help="after each case's timed rounds, profile a few steps: a Chrome trace "
                    "per case (and rank) in DIR and the top operators in the record (default: "
                    "off, the profiler is never entered)")
    group.addoption("--gpubench-hygiene", default="", metavar="FILE",
                    help="after the cases, measure the no_grad / del hygiene of each model "
                    "whose cases ran here and write it to FILE as JSON (gpubench run passes "
                    "memory.json: this process has the models' libraries loaded already)")
    group.addoption("--gpubench-resume", action="store_true",
                    help="continue the run recorded in the journal beside --benchmark-json "
                    "(cases.jsonl): its passed cases are kept and not run again; refused when "
                    "the journal is of another profile, device, model set or options")


class Options:
    """The resolved command-line choices of a benchmark session."""

    def __init__(self, config: pytest.Config):
        self.device, self.profile = resolve_target(config.getoption("--gpubench-device"),
                                                   config.getoption("--gpubench-profile"))
        names = tuple(m.strip() for m in config.getoption("--gpubench-models").split(",")
                      if m.strip())
        self.models = names or PROFILE_MODELS[self.profile]
        set_probe_timeout(config.getoption("--gpubench-timeout") or DEFAULT_TIMEOUT_S)
        for spec in self.models:  # a bad spec fails here, before any case runs
            try:
                checked(spec, self.profile)
            except WorkloadError as err:
                raise pytest.UsageError(f"--gpubench-models: {err}") from None
        self.model_names = tuple(resolve(spec, self.profile).name for spec in self.models)
        self.groups = tuple(g.strip() for g in config.getoption("--gpubench-groups").split(",")
                            if g.strip())
        bad = [g for g in self.groups if g not in GROUPS]
        if bad:
            raise pytest.UsageError(f"--gpubench-groups must be from {', '.join(GROUPS)}; got "
                                    f"{', '.join(bad)}")
        budget = profile(self.profile)  # rounds and times: gpubench.workloads.profiles
        rounds, warmup = budget.rounds, budget.warmup
        fixed_rounds = config.getoption("--gpubench-rounds")
        self.rounds = fixed_rounds or rounds
        min_time = config.getoption("--gpubench-min-time")
        self.min_time_s = ((0.0 if fixed_rounds else budget.min_time_s)
                           if min_time is None else min_time)
        w = config.getoption("--gpubench-warmup")
        self.warmup = warmup if w is None else w
        target = config.getoption("--gpubench-target-width")
        self.target_width = ((0.0 if fixed_rounds else budget.target_width)
                             if target is None else target)
        max_time = config.getoption("--gpubench-max-time")
        self.max_time_s = budget.max_time_s if max_time is None else max_time
        block = config.getoption("--gpubench-energy-block")
        self.energy_block_s = budget.energy_block_s if block is None else block
        self.slow = config.getoption("--gpubench-slow")
        self.threads = config.getoption("--gpubench-threads")
        self.timeout_s = config.getoption("--gpubench-timeout") or DEFAULT_TIMEOUT_S
        self.paired = not config.getoption("--gpubench-unpaired")
        self.partner = config.getoption("--gpubench-partner") or "process"
        self.trace_dir = config.getoption("--gpubench-trace") or None
        self._baseline = None
        from gpubench.measure.runner import RankPool

        self.ranks = RankPool()
        """Rank processes kept between consecutive multi-process cases."""
        self.ran: set[str] = set()
        """Ids of the cases that passed in this session."""

    def run_key(self) -> dict:
        """What makes two sessions one run (``--gpubench-resume`` checks it): the cases
        measured, how, where, and by which versions. ``-k`` and ``--gpubench-timeout`` are
        not part of it."""
        import platform

        import gpubench

        return {"profile": self.profile, "device": self.device, "models": list(self.models),
                "groups": list(self.groups), "rounds": self.rounds, "warmup": self.warmup,
                "max_time_s": self.max_time_s, "min_time_s": self.min_time_s,
                "target_width": self.target_width,
                "energy_block_s": self.energy_block_s,
                "paired": self.paired, "partner": self.partner, "slow": self.slow,
                "threads": self.threads,
                "node": platform.node(), "torch": torch.__version__,
                "gpubench": gpubench.__version__}

    def case_info(self, item) -> dict:
        """``case_id``, ``model`` and ``group`` of a benchmark case's item (journal lines of
        failed cases), or ``{}`` for another test."""
        callspec = getattr(item, "callspec", None)
        case = getattr(self, "cases", {}).get(callspec.params.get("case_id")) \
            if callspec is not None else None
        if case is None:
            return {}
        return {"case_id": case.id, "model": case.cfg.name, "group": case.group}

    def paired_baseline(self, cfg):
        """The running PairedBaseline of ``cfg``'s baseline (one at a time, started on first
        use), or None when pairing is off."""
        if not self.paired:
            return None
        spare = None
        if self._baseline is not None and not self._baseline.matches(cfg):
            spare = self._baseline.handoff()  # its worker process builds the next baseline
            self._baseline = None
        if self._baseline is None:
            from gpubench.measure.protocol import PairedBaseline

            self._baseline = PairedBaseline(cfg, self.timeout_s, max(1, self.warmup), spare,
                                            in_process=self.partner == "process")
        return self._baseline

    def close_baseline(self):
        if self._baseline is not None:
            self._baseline.close()
            self._baseline = None


def pytest_configure(config):
    workers = getattr(config.option, "numprocesses", None)
    if workers not in (None, 0, "0"):
        raise pytest.UsageError(
            f"-n {workers}: the benchmark cases time the whole machine and must run one at a "
            "time; run them without pytest-xdist")
    config.gpubench = Options(config)
    target = config.getoption("benchmark_json", None)
    if target:  # the results folder is the run's output, not a change to the code measured
        from gpubench.measure.provenance import ignore_in_commit

        ignore_in_commit(Path(target).parent)
    from gpubench.measure.memory import steady_malloc

    steady_malloc()  # this process's and its workers' (the hand-written loops' too)
    data_dir = config.getoption("--gpubench-data-dir")
    if data_dir:
        os.environ["GPUBENCH_DATA_DIR"] = data_dir  # inherited by worker processes
    if config.gpubench.threads:  # here and in the run's worker processes
        from gpubench.launchers.workers import set_run_threads

        set_run_threads(config.gpubench.threads)
    # Keep the raw per-round times in the JSON: comparisons use a statistical test on them.
    if hasattr(config.option, "benchmark_save_data"):
        config.option.benchmark_save_data = True
    json_path = getattr(config.option, "benchmark_json", None)
    if json_path:  # every finished case on disk at once (gpubench.measure.journal)
        from gpubench.measure.journal import Journal, JournalError

        journal = Journal(config, json_path, config.gpubench.run_key(),
                          resume=config.getoption("--gpubench-resume"),
                          case_info=config.gpubench.case_info)
        try:
            journal.start()
        except JournalError as err:
            raise pytest.UsageError(str(err)) from None
        config.pluginmanager.register(journal, "gpubench-journal")
    elif config.getoption("--gpubench-resume"):
        raise pytest.UsageError("--gpubench-resume needs --benchmark-json=FILE (the run to "
                                "continue is recorded beside it)")


def pytest_generate_tests(metafunc):
    if "case_id" in metafunc.fixturenames:
        opts = metafunc.config.gpubench
        try:
            cases = profile_cases(opts.profile, opts.device, opts.models, opts.groups or None)
        except ValueError as err:
            raise pytest.UsageError(str(err)) from None
        opts.cases = {c.id: c for c in cases}
        # Parametrized by the readable id (a string), so the JSON's params serialize.
        params = [pytest.param(c.id, id=c.id, marks=[pytest.mark.slow] if c.slow else [])
                  for c in cases]
        metafunc.parametrize("case_id", params)


def pytest_collection_modifyitems(session, config, items):
    """Cases first, then the claims pairs and the harness checks (which build their own)."""
    order = {"test_training_step.py": 0}
    items.sort(key=lambda item: order.get(item.path.name, 1))


def pytest_collection_finish(session):
    """The cases this session will run: those its selection (``-k``, ``-m``) kept."""
    opts = getattr(session.config, "gpubench", None)
    if opts is not None:
        cases = getattr(opts, "cases", {})
        opts.selected = [cases[item.callspec.params["case_id"]] for item in session.items
                         if "case_id" in getattr(getattr(item, "callspec", None), "params", {})
                         and item.callspec.params["case_id"] in cases]
        # The models of the cases that may run in forked rank processes: their libraries
        # imported once, by the fork server, not by each rank (a case that then skips costs
        # the server an import; asking each case here would build models at collection).
        preload_workload_imports(forked_imports(
            case.cfg for case in opts.selected if opts.slow or not case.slow))


def pytest_runtest_teardown(item, nextitem):
    """The paired baseline worker lives while consecutive cases share it; the rank processes
    of multi-process cases while the next case can run in them."""
    opts = getattr(item.config, "gpubench", None)
    if opts is None:
        return
    if nextitem is None or "case_id" not in nextitem.fixturenames:
        opts.close_baseline()
    if opts.ranks.group is not None:
        next_case = _next_running_case(item, nextitem, opts)
        if next_case is None or not opts.ranks.matches(next_case.cfg, opts.timeout_s):
            opts.ranks.close()


def _next_running_case(item, nextitem, opts):
    """The next case of the session that will run here (past those that skip: more GPUs than
    the machine has, slow ones not asked for), or None when a test of another kind comes
    first."""
    items = item.session.items
    start = items.index(nextitem) if nextitem in items else len(items)
    cases = getattr(opts, "cases", {})
    for later in items[start:]:
        callspec = getattr(later, "callspec", None)
        case = cases.get(callspec.params.get("case_id")) if callspec is not None else None
        if case is None:
            return None
        if (opts.slow or not case.slow) and case.skip_reason() is None:
            return case
    return None


@pytest.fixture(autouse=True)
def _record_schema(request):
    """Every record says which version of the record it is (``gpubench.measure.version``),
    from the start of its test: a record the journal saves mid-run carries it too."""
    if "benchmark" in request.fixturenames:
        request.getfixturevalue("benchmark").extra_info["schema"] = SCHEMA_VERSION


@pytest.fixture
def bench_case(case_id, options):
    return options.cases[case_id]


@pytest.fixture
def options(request) -> Options:
    return request.config.gpubench


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """The cases that passed (``Options.ran``; ``--gpubench-hygiene`` measures their models)."""
    report = yield
    opts = getattr(item.config, "gpubench", None)
    if opts is not None and report.when == "call" and report.passed:
        case_id = getattr(getattr(item, "callspec", None), "params", {}).get("case_id")
        if case_id in getattr(opts, "cases", {}):
            opts.ran.add(case_id)
    return report


def pytest_sessionfinish(session, exitstatus):
    """``--gpubench-hygiene FILE``: the no_grad / del measurements of each model whose cases ran
    (``gpubench.cli.memory.hygiene_reports``), here, where the models' libraries are imported
    already; a session stopped early (a signal, a full disk) leaves them to ``gpubench run``."""
    opts = getattr(session.config, "gpubench", None)
    path = session.config.getoption("--gpubench-hygiene", default="")
    if opts is None or not path or session.shouldstop or session.shouldfail or \
            exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        return
    ran = {opts.cases[c].cfg.name for c in opts.ran}
    models = {name: spec for name, spec in zip(opts.model_names, opts.models, strict=True)
              if name in ran}
    if not models:
        return
    import sys

    from gpubench.cli.memory import hygiene_reports
    from gpubench.util import atomic

    try:
        atomic.write_json(path, hygiene_reports(models, opts.profile, opts.device), indent=1)
    except OSError as err:  # gpubench run measures them itself; the cases' results stand
        print(f"gpubench: warning: cannot write the no_grad/del measurements to {path}: "
              f"{err.strerror or err}", file=sys.stderr)


def pytest_benchmark_update_commit_info(config, commit_info):
    """pytest-benchmark's ``dirty`` counts every tracked file; a run writing into a tracked
    results folder would mark its own commit dirty: only changes outside it count
    (``gpubench.measure.provenance.checkout_dirty``, from where pytest-benchmark asked git)."""
    if commit_info.get("dirty"):
        from gpubench.measure.provenance import checkout_dirty

        commit_info["dirty"] = checkout_dirty(Path.cwd()) is not False


def pytest_benchmark_update_machine_info(config, machine_info):
    # The storage probe of the data folder, once per run, when a case it ran reads on-disk
    # data (not one that -k left out).
    cases = getattr(config.gpubench, "selected", getattr(config.gpubench, "cases", {}).values())
    on_disk = any(c.cfg.loader.dataset not in GENERATED_DATASETS for c in cases)
    probe = on_disk and not config.getoption("--gpubench-no-storage-probe")
    machine_info["gpubench"] = describe_machine(config.gpubench.device,
                                                storage_dir=default_data_dir() if probe else None)


def pytest_unconfigure(config):
    """A thread a workload left running (non-daemon) cannot keep the finished run alive: it is
    named in one warning and the process exits with pytest's status (``gpubench.util.signals``)."""
    from gpubench.util.signals import exit_despite_stray_threads

    session = config.pluginmanager.get_plugin("session")
    exit_despite_stray_threads(int(getattr(session, "exitstatus", 1) or 0))
