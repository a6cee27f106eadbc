import pytest

from gpubench.util import atomic


def test_interrupted_write_keeps_previous_file(tmp_path):
    dest = tmp_path / "benchmark.json"
    atomic.write_text(dest, "old")
    with pytest.raises(KeyboardInterrupt):
        with atomic.atomic_path(dest) as tmp:
            tmp.write_text("half")
            raise KeyboardInterrupt
    assert dest.read_text() == "old"
    assert list(tmp_path.iterdir()) == [dest]  # no temporary left behind


def test_move_into_place(tmp_path):
    src = tmp_path / "a"
    src.write_text("new")
    atomic.move_into_place(src, tmp_path / "sub" / "b")
    assert (tmp_path / "sub" / "b").read_text() == "new"
    assert not src.exists()


def _dead_pid() -> int:
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_temporaries_carry_their_owner_and_normal_permissions(tmp_path):
    import os

    seen = []
    with atomic.atomic_path(tmp_path / "benchmark.json") as tmp:
        seen.append(tmp.name)
        tmp.write_text("{}")
        mode = tmp.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    assert seen[0].startswith(f".benchmark.json.{os.getpid()}-{atomic.HOST_ID}.")
    assert atomic.is_temp_file_name(seen[0])
    assert mode == 0o666 & ~umask
    assert (tmp_path / "benchmark.json").stat().st_mode & 0o777 == 0o666 & ~umask


def test_stale_temporaries_removed_concurrent_and_foreign_kept(tmp_path):
    import os
    import time

    dead, alive = _dead_pid(), os.getppid()
    names = {
        "dead owner": f".benchmark.json.{dead}-{atomic.HOST_ID}.abcd1234.tmp.json",
        "live owner": f".summary.md.{alive}-{atomic.HOST_ID}.abcd1234.tmp.md",
        "other host, fresh": f".report.md.{dead}-00000000.abcd1234.tmp.md",
        "other host, old": f".report.html.{dead}-00000000.abcd1234.tmp.html",
        "older gpubench, old": ".speedup.png.abcd1234.tmp.png",
        "older gpubench, fresh": ".memory.png.abcd1234.tmp.png",
        "user's hidden file, old": ".notes.tmp",
    }
    for name in names.values():
        (tmp_path / name).write_text("x")
    old = time.time() - 2 * atomic.STALE_AFTER_S
    for what in ("other host, old", "older gpubench, old", "user's hidden file, old"):
        os.utime(tmp_path / names[what], (old, old))
    removed = {p.name for p in atomic.remove_stale_temporaries(tmp_path)}
    assert removed == {names["dead owner"], names["other host, old"],
                       names["older gpubench, old"]}


def test_partial_dataset_folders_of_killed_generations_are_removed(tmp_path):
    import os

    from gpubench.workloads import datasets

    dead = tmp_path / f".tokens-8x16-v100-s0.{_dead_pid()}-{atomic.HOST_ID}.abcd1234"
    live = tmp_path / f".tokens-8x16-v100-s0.{os.getppid()}-{atomic.HOST_ID}.efgh5678"
    for folder in (dead, live):
        folder.mkdir()
        (folder / "tokens.bin").write_bytes(b"partial")
    final = datasets.ensure_token_file(tmp_path, count=8, seq_len=16, vocab_size=100)
    assert not dead.exists() and live.exists()  # a concurrent generation is left alone
    assert final.is_dir() and not [p for p in tmp_path.iterdir()
                                   if p.name.startswith(".") and p != live]


def test_dataset_generation_killed_midway_is_cleaned_by_the_next_generation(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from gpubench.workloads import datasets

    code = ("import sys; from pathlib import Path; from gpubench.workloads.datasets import "
            "ensure_image_folder as e; print('go', flush=True); "
            "e(Path(sys.argv[1]), 'images-png', 100000, 64, 10)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"go"
    deadline = time.monotonic() + 600

    def partial_with_files():  # generation under way: its hidden folder holds something
        return any(p.name.startswith(".images-png") and any(p.rglob("*"))
                   for p in tmp_path.iterdir())

    while not partial_with_files():
        assert time.monotonic() < deadline and proc.poll() is None, "generation never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert len(partial) == 1 and any(partial[0].iterdir())  # what a kill leaves
    datasets.ensure_image_folder(tmp_path, "images-png", 4, 16, 2)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
