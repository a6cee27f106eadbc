"""A workload's facts on disk (``gpubench.workloads.factcache``): a later process reads them
without building the model, and any change to what they depend on builds it again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from gpubench import Workload
from gpubench.workloads import factcache
from gpubench.workloads.api import WorkloadFacts
from gpubench.workloads.registry import resolve

BUILDS: list[str] = []
"""One entry per ``build_model`` call of ``counted`` (the spec loads this file as a module of
its own: its builds count here, in the test's module)."""

SPEC = f"{Path(__file__).resolve()}:counted"


def counted(profile: str = "smoke") -> Workload:
    def build_model():
        import test_factcache

        test_factcache.BUILDS.append(profile)
        return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))

    return Workload(name="counted", build_model=build_model,
                    make_batch=lambda n, g: (torch.randn(n, 4, generator=g),
                                             torch.randint(0, 2, (n,), generator=g)),
                    micro_batch=4, loss_fn=nn.functional.cross_entropy)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty facts cache, no workload resolved in memory, no build counted."""
    monkeypatch.setenv("GPUBENCH_CACHE_DIR", str(tmp_path))
    BUILDS.clear()
    resolve.cache_clear()
    factcache._environment.cache_clear()
    yield tmp_path / "facts"
    resolve.cache_clear()
    factcache._environment.cache_clear()


def fresh(spec: str = SPEC, profile: str = "smoke") -> Workload:
    """The workload as a new process resolves it: a new object, no facts in memory."""
    resolve.cache_clear()
    workload = resolve(spec, profile)
    assert "facts" not in vars(workload)
    return workload


def test_a_later_process_reads_the_facts_without_building_the_model(cache):
    first = fresh().facts
    assert BUILDS == ["smoke"]
    assert len(list(cache.glob("*.json"))) == 1
    again = fresh().facts
    assert BUILDS == ["smoke"]  # read from disk: no probe build
    assert again == first and isinstance(again.linears, tuple)
    assert again.batch_norm and again.linears == (("0", 8, 4), ("2", 2, 8))


def test_a_change_in_what_the_facts_depend_on_builds_again(cache, monkeypatch):
    fresh().facts  # noqa: B018
    fresh(profile="cpu").facts  # noqa: B018 - another profile: its own shapes
    assert BUILDS == ["smoke", "cpu"]
    monkeypatch.setattr(torch, "__version__", "99.0.0+other")  # another torch
    factcache._environment.cache_clear()
    fresh().facts  # noqa: B018
    assert BUILDS == ["smoke", "cpu", "smoke"]
    monkeypatch.setattr(factcache, "SOURCES", (*factcache.SOURCES, "measure/version.py"))
    factcache._environment.cache_clear()  # gpubench's code changed
    fresh().facts  # noqa: B018
    assert BUILDS == ["smoke", "cpu", "smoke", "smoke"]
    assert len(list(cache.glob("*.json"))) == 4


def test_a_changed_workload_file_builds_again(cache, tmp_path):
    path = tmp_path / "model.py"
    text = ("import torch\nfrom torch import nn\nfrom gpubench import Workload\n"
            "import test_factcache\n\n"
            "def wl():\n"
            "    def build():\n"
            "        test_factcache.BUILDS.append('file')\n"
            "        return nn.Linear(4, {out})\n"
            "    return Workload(name='wl', build_model=build, micro_batch=2,\n"
            "                    make_batch=lambda n, g: (torch.randn(n, 4), torch.zeros(n)))\n")
    path.write_text(text.format(out=3))
    spec = f"{path}:wl"
    assert fresh(spec).facts.linears == (("", 3, 4),)
    assert fresh(spec).facts.linears == (("", 3, 4),)
    assert BUILDS == ["file"]
    path.write_text(text.format(out=5))  # the same spec, other code
    import sys

    for name in [m for m in sys.modules if m.startswith("gpubench_user_")]:
        del sys.modules[name]  # a new process imports the file anew
    assert fresh(spec).facts.linears == (("", 5, 4),)
    assert BUILDS == ["file", "file"]


def test_a_damaged_entry_is_probed_again_and_replaced(cache):
    fresh().facts  # noqa: B018
    (entry,) = cache.glob("*.json")
    for damage in ("{not json", json.dumps({"key": "other", "facts": {}}),
                   json.dumps({**json.loads(entry.read_text()), "facts": {"nope": 1}})):
        good = entry.read_text()
        entry.write_text(damage)
        fresh().facts  # noqa: B018
        assert json.loads(entry.read_text()) == json.loads(good)  # rewritten whole
    assert BUILDS == ["smoke"] * 4


def test_workloads_no_file_describes_are_not_cached(cache):
    made = counted()  # not resolved: no spec or profile
    assert factcache.facts_key(made, ("x",)) is None
    made.facts  # noqa: B018
    by_module = fresh("test_factcache:counted")  # MODULE:FACTORY: its code has no file named
    assert factcache.facts_key(by_module, ("x",)) is None
    by_module.facts  # noqa: B018
    assert not cache.exists()
    assert BUILDS == ["smoke", "smoke"]


def test_the_built_in_workloads_key_on_gpubench_and_the_libraries(cache):
    workload = resolve("resnet18", "smoke")
    key = factcache.facts_key(workload, tuple(WorkloadFacts.__dataclass_fields__))
    assert key["spec"] == "resnet18" and key["profile"] == "smoke" and key["code"] == ""
    assert key["libraries"]["torch"] == torch.__version__
    assert all(key["gpubench"].values())  # each source file read


def test_a_transformers_config_file_keys_on_its_content(tmp_path):
    from types import SimpleNamespace

    config = tmp_path / "config.json"
    config.write_text('{"model_type": "llama"}')
    named = SimpleNamespace(spec="transformers:llama?hidden_size=64", build_model=None)
    from_file = SimpleNamespace(spec=f"transformers:{config}?hidden_size=64", build_model=None)
    assert factcache._code_digest(named) == ""
    digest = factcache._code_digest(from_file)
    config.write_text('{"model_type": "llama", "vocab_size": 512}')
    assert digest and factcache._code_digest(from_file) not in ("", digest)


def _key(workload: Workload) -> dict:
    from dataclasses import fields

    return factcache.facts_key(workload, tuple(f.name for f in fields(WorkloadFacts)))


def test_the_probing_lock_is_exclusive_and_a_waiter_gives_up_after_its_wait(cache):
    import fcntl

    key = _key(fresh())
    with factcache.probing(key, 1.0):
        lock = factcache._path(key).with_suffix(".lock")
        with open(lock, "a") as other:  # another process's handle on the same entry
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # held elsewhere: a waiter probes without it once its wait is over
            with factcache.probing(key, 0.1):
                pass
    with open(lock, "a") as other:  # let go at the end of the block
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_processes_that_miss_the_same_entry_wait_for_the_one_probing_it(cache):
    """A job's ranks start together and all miss the entry: one probes, the others wait for
    it and read it. Here a thread holds the entry's lock as a probing process would, and the
    test asks for the facts meanwhile: it must not build the model."""
    import threading
    import time
    from dataclasses import asdict

    workload = fresh()
    key = _key(workload)
    holding, asking, wrote = threading.Event(), threading.Event(), threading.Event()

    def probing_process():
        with factcache.probing(key, 30.0):
            holding.set()
            asking.wait(10)
            time.sleep(0.5)  # the other is at the lock by now (were it not, it reads the entry)
            factcache.write_facts(key, asdict(workload._probe_facts()))
            wrote.set()

    first = threading.Thread(target=probing_process)
    first.start()
    assert holding.wait(10)
    other = fresh()
    asking.set()
    facts = other.facts  # waits for the lock, then reads what the first wrote
    first.join(10)
    assert not first.is_alive() and wrote.is_set()
    assert BUILDS == ["smoke"]  # the first's probe only
    assert facts == WorkloadFacts.from_json(factcache.read_facts(key))
    assert len(list(cache.glob("*.json"))) == 1


def test_a_cache_folder_that_cannot_be_made_still_gives_the_facts(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("GPUBENCH_CACHE_DIR", str(blocker))  # facts/ cannot be made under it
    BUILDS.clear()
    resolve.cache_clear()
    factcache._environment.cache_clear()
    try:
        assert fresh().facts.batch_norm and fresh().facts.batch_norm
        assert BUILDS == ["smoke", "smoke"]  # nothing stored: each process probes
    finally:
        resolve.cache_clear()
        factcache._environment.cache_clear()
