"""Where, with what and when a measurement was taken, read without torch: the fields of a
machine fingerprint (``gpubench.measure.machine.fingerprint`` takes it), how two differ, the
words the report and the answer name it with, and the machine a result file records
(``recorded_machine``: what the history's series and compare's across-machines check key on)."""

from __future__ import annotations

import functools
import hashlib
import json

OUTPUT_FOLDERS: list = []
"""Folders whose changes are a run's own output (its results folder, set by
``ignore_in_commit``), not a change to the code it measured."""


def ignore_in_commit(folder) -> None:
    """Leave ``folder`` (a run's results folder) out of ``dirty``: a run that writes into a
    tracked results folder (``results/cpu/`` here) would otherwise record its own commit as
    dirty."""
    from pathlib import Path

    folder = Path(folder).resolve()
    if folder not in OUTPUT_FOLDERS:
        OUTPUT_FOLDERS.append(folder)
        source_commit.cache_clear()


def checkout_dirty(where) -> bool | None:
    """Whether the git checkout holding ``where`` has tracked files that differ from its commit,
    outside ``OUTPUT_FOLDERS`` (those inside the checkout, below its top folder: a results file
    written to the top folder sets nothing aside); None outside a checkout or where git
    fails."""
    import os
    import subprocess
    from pathlib import Path

    try:
        top = subprocess.run(["git", "-C", str(where), "rev-parse", "--show-toplevel"],
                             text=True, capture_output=True, timeout=10)
        if top.returncode != 0:
            return None
        status = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "-z",
                                 "--untracked-files=no"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if status.returncode != 0:
        return None
    root = Path(top.stdout.strip()).resolve()
    outputs = [o for o in OUTPUT_FOLDERS if o != root and o.is_relative_to(root)]
    entries = [os.fsdecode(e) for e in status.stdout.split(b"\0")]
    changed, i = [], 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        if len(entry) < 4:
            continue
        changed.append(root / entry[3:])
        if "R" in entry[:2] or "C" in entry[:2]:  # a rename or copy: its source path follows
            changed.append(root / entries[i])
            i += 1
    # The folder resolved, not the file: a changed symlink is a change where it sits.
    return any(not any(path.parent.resolve().joinpath(path.name).is_relative_to(out)
                       for out in outputs)
               for path in changed)


@functools.cache
def source_commit() -> str | None:
    """The git commit of the gpubench source that measured (with ``+dirty`` when its tracked
    files differ from it, a run's own results folder aside: ``checkout_dirty``), or None
    outside a git checkout."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], text=True,
                              capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if checkout_dirty(root) else "")


FINGERPRINT_MACHINE = ("cpu", "cpu_count", "device", "device_name", "device_count", "driver")
"""The fields of a fingerprint that name the machine; with ``libraries``, what two measurements
must share to be read as one (``fingerprint_difference``); ``commit`` and ``date`` say when."""


def fingerprint_difference(a: dict | None, b: dict | None) -> str | None:
    """How the machines or library versions of two fingerprints differ, in words (the first
    few differences), or None when they are the same machine with the same libraries. A
    missing fingerprint differs from any."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return "no machine fingerprint recorded"
    diffs = [f"{k} {a.get(k)!r} vs {b.get(k)!r}" for k in FINGERPRINT_MACHINE
             if a.get(k) != b.get(k)]
    libs_a, libs_b = a.get("libraries") or {}, b.get("libraries") or {}
    diffs += [f"{k} {libs_a.get(k)} vs {libs_b.get(k)}"
              for k in sorted(set(libs_a) | set(libs_b)) if libs_a.get(k) != libs_b.get(k)]
    if not diffs:
        return None
    return ", ".join(diffs[:3]) + (f" (and {len(diffs) - 3} more)" if len(diffs) > 3 else "")


def describe_fingerprint(fp: dict | None) -> str:
    """Where and when, in a few words: "Intel Xeon x2 (cpu), torch 2.4, commit abc1234,
    2026-12-02"."""
    if not isinstance(fp, dict):
        return "an unrecorded machine"
    count = fp.get("device_count")
    where = f"{fp.get('device_name') or fp.get('cpu') or '?'}"
    if fp.get("device") == "cuda":
        where += f" x{count}" if count and count != 1 else ""
        where += f" (driver {fp['driver']})" if fp.get("driver") else ""
    else:
        where += f" ({fp.get('cpu_count')} CPUs)" if fp.get("cpu_count") else ""
    libs = fp.get("libraries") or {}
    parts = [where, f"torch {libs['torch']}" if libs.get("torch") else None,
             f"commit {str(fp['commit'])[:9]}" if fp.get("commit") else None,
             str(fp["date"])[:10] if fp.get("date") else None]
    return ", ".join(p for p in parts if p)


RUN_SETTINGS = ("cpu_capability", "torch_threads")
"""What a result file's machine record (``gpubench.measure.machine.machine_info``) adds to its
fingerprint's machine: the CPU kernels torch dispatched to and its threads, under which the
same machine times another way."""

OLD_SOFTWARE = ("torch", "cuda", "cudnn", "torchvision", "transformers")
"""The library versions a result file recorded before its fingerprint did (beside Python's)."""


def recorded_machine(machine_info: dict | None) -> dict:
    """The machine a result file was measured on, from its pytest-benchmark ``machine_info``:
    ``hardware`` (the fingerprint's machine fields, ``FINGERPRINT_MACHINE`` but the device
    type, and the ``RUN_SETTINGS``), ``software`` (the fingerprint's library versions), an ``id``
    hashed from the hardware and a ``name``. A file without a fingerprint (written before
    gpubench recorded one, or by pytest-benchmark alone) is read from the fields it has: its
    machine record's CPU and device, else pytest-benchmark's CPU brand, and its library
    versions; the same machine gets the same id either way (the driver, which only a
    fingerprint records, aside)."""
    info = machine_info if isinstance(machine_info, dict) else {}
    record = info.get("gpubench") if isinstance(info.get("gpubench"), dict) else {}
    cpu = info.get("cpu") if isinstance(info.get("cpu"), dict) else {}
    fp = record.get("fingerprint")
    if isinstance(fp, dict):
        hardware = {k: fp.get(k) for k in FINGERPRINT_MACHINE if k != "device"}
        software = dict(fp.get("libraries") or {})
    else:
        hardware = {k: record.get(k) for k in FINGERPRINT_MACHINE if k != "device"}
        hardware["cpu"] = hardware["cpu"] or cpu.get("brand_raw")
        hardware["cpu_count"] = hardware["cpu_count"] or cpu.get("count")
        hardware["device_name"] = hardware["device_name"] or hardware["cpu"]
        software = {k: record.get(k) for k in OLD_SOFTWARE}
        software["python"] = info.get("python_version")
    hardware.update({k: record.get(k) for k in RUN_SETTINGS})
    digest = hashlib.sha1(json.dumps(hardware, sort_keys=True, default=str).encode())
    count = hardware.get("device_count") or 1
    gpu = hardware.get("device_name") and hardware.get("device_name") != hardware.get("cpu")
    name = (f"{count} x {hardware['device_name']}"
            + (f", driver {hardware['driver']}" if hardware.get("driver") else "") if gpu else
            f"{hardware.get('cpu') or 'unknown CPU'}, {hardware.get('cpu_count') or '?'} CPUs"
            + (f", {hardware['torch_threads']} threads" if hardware.get("torch_threads")
               else "")
            + (f", {hardware['cpu_capability']}" if hardware.get("cpu_capability") else ""))
    return {"id": digest.hexdigest()[:10], "name": name, "hardware": hardware,
            "software": software}


def library_changes(a: dict | None, b: dict | None) -> str:
    """The libraries that both ``software`` mappings record, at different versions:
    "torch 2.4.0 -> 2.5.0, ..." ("" when none changed)."""
    a, b = a if isinstance(a, dict) else {}, b if isinstance(b, dict) else {}
    return ", ".join(f"{k} {a[k]} -> {b[k]}" for k in a
                     if a[k] is not None and b.get(k) is not None and str(a[k]) != str(b[k]))
