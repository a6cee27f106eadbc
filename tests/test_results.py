import json

import pytest

from gpubench.results import ResultsError, load_results


def _write(path, benchmarks):
    path.write_text(json.dumps({"machine_info": {}, "benchmarks": benchmarks, "version": "5"}))
    return path


def test_not_json_names_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    with pytest.raises(ResultsError, match="bad.json"):
        load_results([bad])


def test_missing_fields_load_with_warning(tmp_path):
    old = _write(tmp_path / "old.json", [
        {"name": "test_x", "group": None, "stats": {"median": 0.1, "data": [0.1, 0.1]},
         "extra_info": {"model": "bert"}},
    ])
    with pytest.warns(UserWarning, match="old.json: records lack .*step_time_s"):
        df = load_results([old])
    assert len(df) == 1 and df.loc[0, "time_median"] == 0.1
    assert df.loc[0, "rounds_s"] == [0.1, 0.1]


def test_several_files_become_runs(tmp_path):
    info = {"case_id": "c", "model": "m"}
    a = _write(tmp_path / "a.json", [{"name": "c", "stats": {}, "extra_info": info}])
    b = _write(tmp_path / "b.json", [{"name": "c", "stats": {}, "extra_info": info}])
    with pytest.warns(UserWarning):
        df = load_results([a, b])
    assert list(df["run"]) == ["a", "b"]
