"""ch07_radix 的测试。被测模块固定叫 solution（judge 和浏览器都会把你的代码放成 solution.py）。"""
import random

import pytest

from solution import RadixTree


def test_insert_then_match():
    t = RadixTree()
    assert t.insert([1, 2, 3], [10, 11, 12]) == 0
    assert t.match([1, 2, 3, 4]) == [10, 11, 12]
    assert t.match([1, 2]) == [10, 11]
    assert t.match([5]) == []
    assert t.match([]) == []
    assert t.size() == 3


def test_insert_splits_where_sequences_diverge():
    t = RadixTree()
    t.insert([1, 2, 3, 4, 5], [0, 1, 2, 3, 4])
    assert t.insert([1, 2, 3, 9], [5, 6, 7, 8]) == 3
    assert t.edges() == [[1, 2, 3], [4, 5], [9]]
    assert t.match([1, 2, 3, 9]) == [0, 1, 2, 8]  # 前三个 token 用的是先插入的值
    assert t.size() == 6


def test_insert_of_a_prefix_adds_nothing():
    t = RadixTree()
    t.insert([1, 2, 3, 4], [0, 1, 2, 3])
    assert t.insert([1, 2], [7, 8]) == 2
    assert t.size() == 4
    assert t.match([1, 2, 3, 4]) == [0, 1, 2, 3]


def test_insert_length_mismatch():
    with pytest.raises(ValueError):
        RadixTree().insert([1, 2], [0])


def test_evict_least_recently_used_leaf_first():
    t = RadixTree()
    t.insert([1, 1], [0, 1])
    t.insert([2, 2], [2, 3])
    t.insert([3, 3], [4, 5])
    t.match([1, 1])  # [1, 1] 刚用过
    assert t.evict(1) == [2, 3]  # 要 1 个，淘汰整个节点
    assert t.evict(1) == [4, 5]
    assert t.match([2, 2]) == []
    assert t.match([1, 1]) == [0, 1]


def test_match_partway_splits_and_refreshes_only_the_front():
    t = RadixTree()
    t.insert([1, 2, 3, 4], [0, 1, 2, 3])
    t.insert([5], [4])  # 比 [1, 2, 3, 4] 新
    assert t.match([1, 2]) == [0, 1]
    assert t.edges() == [[1, 2], [3, 4], [5]], \
        f"match([1, 2]) 停在节点 [1, 2, 3, 4] 的中间，应把它切成 [1, 2] 和 [3, 4]；edges() 是 {t.edges()}"
    assert t.evict(1) == [2, 3], \
        "match([1, 2]) 只让切出来的前一段 [1, 2] 算刚用过；后一段 [3, 4] 的时刻不变（比 [5] 早），应先被淘汰"
    assert t.evict(1) == [4]  # [1, 2] 成了叶子，但刚用过：[5] 先走


def test_insert_refreshes_the_path_it_walks():
    t = RadixTree()
    t.insert([1, 2], [0, 1])
    t.insert([5], [2])
    assert t.insert([1, 2], [7, 8]) == 2  # 已经全在树里，什么都不加
    assert t.evict(1) == [2], "insert([1, 2]) 走过了 [1, 2]：插入经过的节点也算刚用过，应先淘汰更久没用的 [5]"


def test_parent_is_evicted_only_after_its_children():
    t = RadixTree()
    t.insert([1, 2, 3], [0, 1, 2])
    t.insert([1, 2, 4], [3, 4, 5])  # [1, 2] 有两个孩子
    t.insert([7], [6])  # 最新
    freed = t.evict(3)
    assert sorted(freed) == [0, 1, 2, 5]  # 两个孩子走了，[1, 2] 成了叶子，接着走
    assert t.edges() == [[7]]


def test_evict_too_much():
    t = RadixTree()
    t.insert([1, 2], [0, 1])
    with pytest.raises(ValueError):
        t.evict(3)
    assert t.evict(2) == [0, 1] and t.size() == 0


def test_random_against_a_dict_of_prefixes():
    rng = random.Random(7)
    t = RadixTree()
    first_value = {}  # 前缀（元组）→ 最先插入这个前缀的那次给它最后一个 token 的值
    next_value = 0
    for _ in range(300):
        tokens = [rng.randrange(3) for _ in range(rng.randint(1, 8))]
        if rng.random() < 0.5:
            values = list(range(next_value, next_value + len(tokens)))
            next_value += len(tokens)
            cached = 0
            while cached < len(tokens) and tuple(tokens[: cached + 1]) in first_value:
                cached += 1
            assert t.insert(tokens, values) == cached
            for i in range(cached, len(tokens)):
                first_value[tuple(tokens[: i + 1])] = values[i]
        want = []
        for i in range(len(tokens)):
            if tuple(tokens[: i + 1]) not in first_value:
                break
            want.append(first_value[tuple(tokens[: i + 1])])
        assert t.match(tokens) == want
    assert t.size() == len(first_value)
    assert sorted(t.evict(t.size())) == sorted(first_value.values())
    assert t.size() == 0 and t.edges() == []
