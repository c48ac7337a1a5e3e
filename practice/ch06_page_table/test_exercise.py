"""ch06_page_table 的测试。被测模块固定叫 solution（judge 和浏览器都会把你的代码放成 solution.py）。"""
import re

import pytest

from solution import OutOfPagesError, grow, pages_needed, token_slots


def test_token_slots_example():
    assert token_slots([7, 2], 4, 2, 6) == [30, 31, 8, 9]


def test_token_slots_page_size_one_is_the_page_list():
    assert token_slots([5, 0, 9, 3], 1, 0, 4) == [5, 0, 9, 3]
    assert token_slots([5, 0, 9, 3], 1, 1, 3) == [0, 9]


def test_token_slots_whole_pages():
    assert token_slots([1, 0], 3, 0, 6) == [3, 4, 5, 0, 1, 2]
    assert token_slots([4], 8, 5, 5) == []


@pytest.mark.parametrize("pages, page_size, start, end, bad", [
    ([1, 2], 4, 0, 9, "9"),       # 两页只放得下 8 个 token
    ([1], 0, 0, 0, "0"),          # page_size 不能是 0
    ([1], 4, -1, 2, "-1"),
    ([1], 4, 3, 2, "2"),          # end < start
])
def test_token_slots_rejects(pages, page_size, start, end, bad):
    with pytest.raises(ValueError) as info:
        token_slots(pages, page_size, start, end)
    assert bad in str(info.value)


@pytest.mark.parametrize("n, page_size, want", [(0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2), (7, 1, 7), (16, 16, 1)])
def test_pages_needed(n, page_size, want):
    assert pages_needed(n, page_size) == want


def test_grow_example():
    pages, free = [7], [3, 5, 9]
    assert grow(pages, free, 4, 3, 9) == [31, 12, 13, 14, 15, 20]
    assert pages == [7, 3, 5] and free == [9]


def test_grow_within_a_page_takes_no_page():
    pages, free = [2], [8, 1]
    assert grow(pages, free, 4, 1, 4) == [9, 10, 11]
    assert pages == [2] and free == [8, 1]


def test_grow_from_empty_request():
    pages, free = [], [6, 4, 0]
    assert grow(pages, free, 2, 0, 3) == [12, 13, 8]
    assert pages == [6, 4] and free == [0]


def test_grow_decode_steps_one_token_at_a_time():
    pages, free = [], list(range(10, 20))
    slots = []
    for n in range(7):
        slots += grow(pages, free, 3, n, n + 1)
    assert slots == [30, 31, 32, 33, 34, 35, 36]
    assert pages == [10, 11, 12] and free == list(range(13, 20))
    assert slots == token_slots(pages, 3, 0, 7)


def test_grow_same_length_changes_nothing():
    pages, free = [1, 2], [3]
    assert grow(pages, free, 4, 6, 6) == []
    assert pages == [1, 2] and free == [3]


def test_grow_out_of_pages_is_atomic():
    pages, free = [7], [8]
    with pytest.raises(OutOfPagesError) as info:
        grow(pages, free, 4, 4, 13)   # 13 个 token 要 4 页：还要 3 页新的，只剩 1 页
    msg = str(info.value)
    numbers = re.findall(r"\d+", msg)  # 按整数比：13 里的 1 和 3 不算
    assert "3" in numbers and "1" in numbers, f"信息里要有还要几页新页（3）和还剩几页（1），得到 {msg!r}"
    assert pages == [7] and free == [8], f"页不够时两个列表都不能改：pages={pages}、free_pages={free}"


def test_grow_rejects_bad_requests():
    with pytest.raises(ValueError):
        grow([1], [2], 4, 5, 3)          # 变短
    with pytest.raises(ValueError):
        grow([1], [2, 3], 4, 5, 6)       # 5 个 token 应该有 2 页，不是 1 页
