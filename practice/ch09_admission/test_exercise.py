"""ch09_admission 的测试。被测模块固定叫 solution。"""
import pytest

from solution import admit


def R(uid, prompt_len, max_tokens, cached=0):
    return dict(uid=uid, prompt_len=prompt_len, max_tokens=max_tokens, cached=cached)


BASE = dict(page_size=4, free_pages=10, evictable_pages=0, reserved_pages=0, free_slots=8, budget=100)


def test_readme_example():
    assert admit([R("a", 20, 20), R("b", 12, 8)], **BASE) == (["a"], 10)


def test_admits_while_pages_last():
    assert admit([R("a", 4, 4), R("b", 4, 4), R("c", 4, 4)], **BASE) == (["a", "b", "c"], 6)


def test_head_of_line_blocks():
    # a 要 11 页放不下；b 只要 1 页，但先来先服务：不跳过 a
    assert admit([R("a", 40, 4), R("b", 2, 2)], **BASE) == ([], 0)


def test_evictable_pages_count_and_reserved_ones_do_not():
    assert admit([R("a", 40, 4)], **{**BASE, "evictable_pages": 5}) == (["a"], 11)
    assert admit([R("a", 8, 0)], **{**BASE, "free_pages": 2, "reserved_pages": 1}) == ([], 1)


def test_cached_pages_are_not_reserved_but_locked():
    # 命中 8 个 token = 2 页：只需预留 5 - 2 = 3 页；它们被锁住，不再算作可淘汰
    assert admit([R("a", 12, 8, cached=8)], **{**BASE, "free_pages": 3, "evictable_pages": 2}) == (["a"], 3)
    # 可淘汰的 2 页正是它命中的那 2 页：锁住后只剩 1 页空闲，放不下 3 页
    assert admit([R("a", 12, 8, cached=8)], **{**BASE, "free_pages": 1, "evictable_pages": 2}) == ([], 0)


def test_budget_lets_the_first_request_in():
    assert admit([R("a", 50, 2), R("b", 3, 1)], **{**BASE, "free_pages": 100, "budget": 10}) == (["a"], 13)
    assert admit([R("a", 5, 2), R("b", 6, 1), R("c", 5, 1)],
                 **{**BASE, "free_pages": 100, "budget": 10}) == (["a"], 2)
    assert admit([R("a", 5, 2), R("b", 5, 3)], **{**BASE, "free_pages": 100, "budget": 10}) == (["a", "b"], 4)


def test_slots_limit():
    assert admit([R(i, 1, 1) for i in range(5)], **{**BASE, "free_slots": 3}) == ([0, 1, 2], 3)


@pytest.mark.parametrize("name", ["page_size", "free_pages", "evictable_pages", "reserved_pages", "free_slots", "budget"])
def test_rejects_bad_arguments(name):
    with pytest.raises(ValueError, match=name):
        admit([], **{**BASE, name: 0 if name == "page_size" else -1})
