"""Where, with what and when a measurement was taken, read without torch: the fields of a
machine fingerprint (``gpubench.measure.machine.fingerprint`` takes it), how two differ, and
the words the report and the answer name it with."""

from __future__ import annotations

import functools


@functools.cache
def source_commit() -> str | None:
    """The git commit of the gpubench source that measured (with ``+dirty`` when its tracked
    files differ from it), or None outside a git checkout."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], text=True,
                              capture_output=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no"], text=True, capture_output=True,
                               timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


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
