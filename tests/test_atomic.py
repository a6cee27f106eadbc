import pytest

from gpubench import atomic


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
