from gpubench.cases import PROFILE_MODELS, profile_cases
from gpubench.config import PROFILES


def test_case_ids_unique_and_baseline_first_per_model():
    for profile in PROFILES:
        cases = profile_cases(profile, "cpu")
        ids = [c.id for c in cases]
        assert len(ids) == len(set(ids)), profile
        for model in PROFILE_MODELS[profile]:
            first = next(c for c in cases if c.cfg.model == model)
            assert first.cfg.is_baseline


def test_accumulation_covers_both_uses():
    cases = [c.cfg for c in profile_cases("cpu", "cpu", ("resnet18",)) if c.group == "accumulation"]
    base_batch = 8
    same_global = [
        c for c in cases if c.accum_steps > 1 and c.micro_batch == base_batch // c.accum_steps
    ]
    same_micro = [c for c in cases if c.accum_steps > 1 and c.micro_batch is None]
    assert same_global and same_micro


def test_compile_cases_are_slow():
    cases = profile_cases("cpu", "cpu")
    assert all(c.slow == c.cfg.compile for c in cases)
    assert any(c.cfg.compile for c in cases)


def test_budget_rounds_shrinks_slow_cases_but_keeps_a_sample():
    from gpubench.runner import MIN_ROUNDS, budget_rounds

    assert budget_rounds(10, 0.01, 4.0) == 10
    assert budget_rounds(10, 0.5, 4.0) == 8
    assert budget_rounds(10, 10.0, 4.0) == MIN_ROUNDS
    assert budget_rounds(3, 10.0, 4.0) == 3  # never more than asked
    assert budget_rounds(10, 10.0, 0) == 10
