"""ch04_moe_align 的测试。被测模块固定叫 solution（judge 和浏览器都会把你的代码放成 solution.py）。"""
import random

import pytest

from solution import align, num_blocks


def test_num_blocks_is_the_upper_bound():
    assert num_blocks(8, 128, 16) == 1 + 8  # decode：1 个 token 选 8 个专家
    assert num_blocks(2048, 128, 16) == 128 + 128
    assert num_blocks(5, 3, 4) == 2 + 3
    with pytest.raises(ValueError):
        num_blocks(0, 8, 16)
    with pytest.raises(ValueError):
        num_blocks(8, 8, 0)


def test_small_example():
    #         p: 0  1  2  3  4  5
    experts = [2, 0, 2, 1, 0, 2]
    rows, block_expert, starts = align(experts, 4, 2)
    assert starts == [0, 2, 4, 8]  # 专家 0 两行一段；专家 1 一行补成两行；专家 2 三行补成四行；专家 3 没有行
    assert rows[:8] == [1, 4, 3, None, 0, 2, 5, None]
    assert len(rows) == 2 * num_blocks(6, 4, 2) == 2 * (3 + 4)
    assert all(r is None for r in rows[8:])
    assert block_expert == [0, 1, 2, 2, -1, -1, -1]


def test_every_pair_once_and_blocks_have_one_expert():
    rng = random.Random(0)
    for _ in range(200):
        E, bm = rng.randint(1, 12), rng.choice([1, 2, 4, 16])
        experts = [rng.randrange(E) for _ in range(rng.randint(1, 60))]
        rows, block_expert, starts = align(experts, E, bm)
        assert len(rows) == bm * len(block_expert) == bm * num_blocks(len(experts), E, bm)
        assert sorted(r for r in rows if r is not None) == list(range(len(experts)))
        for b, e in enumerate(block_expert):
            chunk = [r for r in rows[b * bm:(b + 1) * bm] if r is not None]
            if e == -1:
                assert not chunk
            else:
                assert chunk and all(experts[r] == e for r in chunk)
                assert chunk == sorted(chunk)
        for e in range(E):
            mine = [p for p, x in enumerate(experts) if x == e]
            assert rows[starts[e]:starts[e] + len(mine)] == mine  # 段从 starts[e] 开始，按 p 升序
            assert starts[e] % bm == 0
        assert starts == sorted(starts)


def test_everyone_on_one_expert_and_more_experts_than_pairs():
    rows, block_expert, starts = align([3] * 5, 4, 2)
    assert starts == [0, 0, 0, 0] and rows[:6] == [0, 1, 2, 3, 4, None]
    assert block_expert == [3, 3, 3, -1, -1, -1, -1]
    rows, block_expert, starts = align([7], 128, 16)
    assert starts[7] == 0 and starts[8] == 16 and rows[0] == 0 and block_expert == [7, -1]


def test_bad_expert_id():
    with pytest.raises(ValueError):
        align([0, 4], 4, 2)
    with pytest.raises(ValueError):
        align([-1], 4, 2)
