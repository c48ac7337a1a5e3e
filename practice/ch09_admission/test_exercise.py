"""ch09_admission 的测试。被测模块固定叫 solution。"""
import pytest

from solution import admit, retract


def Q(uid, prompt_len, max_tokens, cached=0):
    return dict(uid=uid, prompt_len=prompt_len, max_tokens=max_tokens, cached=cached)


def R(length, final_len, held_pages, uid=None):
    return dict(uid=uid, length=length, final_len=final_len, held_pages=held_pages)


BASE = dict(page_size=4, free_pages=10, evictable_pages=0, free_slots=8, budget=100, ratio=1.0)


def test_readme_example():
    queue = [Q("a", 20, 20), Q("b", 12, 8)]
    assert admit(queue, [], **BASE) == ["a"]
    assert admit(queue, [], **{**BASE, "ratio": 0.2}) == ["a", "b"]


def test_ratio_one_reserves_whole_lives():
    assert admit([Q("a", 4, 4), Q("b", 4, 4), Q("c", 4, 4)], [], **BASE) == ["a", "b", "c"]
    assert admit([Q("a", 4, 4)] * 6, [], **BASE) == ["a"] * 5


def test_running_requests_keep_their_estimate():
    # 运行中的请求已经 20 个 token（5 页），最多 60：ratio 1 时还要 10 页，空闲的 10 页全是它的
    assert admit([Q("a", 4, 0)], [R(20, 60, 5)], **BASE) == []
    # ratio 0.5：它估计长到 40 个 token，还要 5 页；剩下 5 页给 a（8 + 0.5·8 = 12 个 token，3 页）
    assert admit([Q("a", 8, 8)], [R(20, 60, 5)], **{**BASE, "ratio": 0.5}) == ["a"]
    assert admit([Q("a", 8, 8), Q("b", 8, 8)], [R(20, 60, 5)], **{**BASE, "ratio": 0.5}) == ["a"]


def test_head_of_line_blocks():
    assert admit([Q("a", 40, 4), Q("b", 2, 2)], [], **BASE) == []


def test_cached_pages_are_locked_not_needed():
    assert admit([Q("a", 12, 8, cached=8)], [], **{**BASE, "free_pages": 3, "evictable_pages": 2}) == ["a"]
    assert admit([Q("a", 12, 8, cached=8)], [], **{**BASE, "free_pages": 1, "evictable_pages": 2}) == []


def test_budget_and_slots():
    big = {**BASE, "free_pages": 100, "budget": 10}
    assert admit([Q("a", 50, 2), Q("b", 3, 1)], [], **big) == ["a"]
    assert admit([Q("a", 5, 2), Q("b", 5, 3)], [], **big) == ["a", "b"]
    assert admit([Q(i, 1, 1) for i in range(5)], [], **{**BASE, "free_slots": 3}) == [0, 1, 2]


def test_retract_the_most_recent_until_it_fits():
    running = [R(9, 0, 2, "old"), R(5, 0, 1, "mid"), R(13, 0, 3, "new")]  # 各要 1 页
    assert retract(running, page_size=4, available_pages=3) == []
    assert retract(running, page_size=4, available_pages=1) == ["new"]  # 腾出 3 页，剩下两个要 2 页
    assert retract(running, page_size=4, available_pages=0) == ["new"]


def test_the_oldest_request_is_never_retracted():
    running = [R(9, 0, 2, "old"), R(8, 0, 2, "new")]  # old 要 1 页，new 不要
    assert retract(running, page_size=4, available_pages=0) == ["new"]
    assert retract([R(9, 0, 2, "old")], page_size=4, available_pages=0) == []


@pytest.mark.parametrize("name", ["page_size", "free_pages", "evictable_pages", "free_slots", "budget", "ratio"])
def test_rejects_bad_arguments(name):
    with pytest.raises(ValueError, match=name):
        admit([], [], **{**BASE, name: 0 if name == "page_size" else (1.5 if name == "ratio" else -1)})
