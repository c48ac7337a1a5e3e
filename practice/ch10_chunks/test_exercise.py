"""ch10_chunks 的测试。被测模块固定叫 solution。"""
import pytest

from solution import plan_chunks


def test_readme_example():
    assert plan_chunks([("a", 100, 0)], budget=32, decodes=3) == [{"a": 29}, {"a": 29}, {"a": 29}, {"a": 13}]



def test_exact_plan_with_a_chunked_request_first():
    assert plan_chunks([("a", 5, 0), ("b", 6, 0), ("c", 30, 0), ("d", 3, 0)], budget=20, decodes=0) == \
        [{"a": 5, "b": 6, "c": 9}, {"c": 20}, {"c": 1, "d": 3}]


def test_cached_tokens_are_not_computed():
    assert plan_chunks([("a", 100, 64)], budget=16, decodes=0) == [{"a": 16}, {"a": 16}, {"a": 4}]
    assert plan_chunks([("a", 40, 37)], budget=16, decodes=0) == [{"a": 3}]


def test_decodes_take_budget_but_prefill_never_starves():
    assert plan_chunks([("a", 3, 0)], budget=4, decodes=10) == [{"a": 1}, {"a": 1}, {"a": 1}]


def test_no_requests():
    assert plan_chunks([], budget=8, decodes=2) == []


@pytest.mark.parametrize("args, name", [
    (([], 0, 0), "budget"), (([], 8, -1), "decodes"), (([("a", 5, 5)], 8, 0), "cached"),
])
def test_rejects_bad_arguments(args, name):
    with pytest.raises(ValueError, match=name):
        plan_chunks(*args)


def test_two_short_prompts_in_one_step():
    assert plan_chunks([("a", 5, 0), ("b", 6, 0)], budget=20, decodes=2) == [{"a": 5, "b": 6}]
