"""ch04_moe_last_arriver 的测试。被测模块固定叫 solution（judge 和浏览器都会把你的代码放成 solution.py）。"""
import random

import pytest

from solution import arrival_order_sum, run_programs


def test_small_example():
    programs = [[(0, 1.5), (3, 2.0)], [(1, 0.25)], [(2, 4.0)]]
    assert run_programs(programs, 2, 2) == ([1.75, 6.0], [1, 2], [2, 2])
    assert arrival_order_sum(programs, 2, 2) == [1.75, 6.0]


def blocks(rng, num_tokens, top_k):
    """像 down 的网格那样分块：每个 token 的 K 行各去一个实例，一个实例里没有同一个 token 的两行。"""
    pairs = [t * top_k + j for t in range(num_tokens) for j in range(top_k)]
    rng.shuffle(pairs)
    programs = []
    for p in pairs:
        home = next((prog for prog in programs if len(prog) < 3 and all(q // top_k != p // top_k for q, _ in prog)), None)
        if home is None:
            home = []
            programs.append(home)
        home.append((p, rng.choice([1e16, -1e16, 1.0, 0.1, 3.0, -2.5])))
    return programs


def test_any_arrival_order_gives_the_same_bits():
    rng = random.Random(0)
    for _ in range(30):
        T, K = rng.randint(1, 6), rng.randint(1, 5)
        programs = blocks(rng, T, K)
        value = {p: v for prog in programs for p, v in prog}
        want = []
        for t in range(T):  # 按 k 的顺序、从 0.0 开始加
            total = 0.0
            for j in range(K):
                total += value[t * K + j]
            want.append(total)
        for _ in range(20):
            order = programs[:]
            rng.shuffle(order)
            out, summed_by, counters = run_programs(order, T, K)
            assert out == want  # 逐位相同（== 比的是浮点数的每一位）
            assert counters == [K] * T  # 每个 token 的 K 行都报到了一次；清零是下一次调用之前的事
            for t in range(T):  # 收尾的是含 token t 的行里、到得最晚的那个实例
                assert summed_by[t] == max(i for i, prog in enumerate(order) if any(p // K == t for p, _ in prog))


def test_arrival_order_is_not_deterministic():
    programs = [[(0, 1e16)], [(1, 1.0)], [(2, -1e16)]]  # 一个 token，K = 3
    outs = set()
    for order in ([0, 1, 2], [0, 2, 1], [1, 0, 2], [2, 1, 0]):
        outs.add(arrival_order_sum([programs[i] for i in order], 1, 3)[0])
        assert run_programs([programs[i] for i in order], 1, 3)[0] == [(0.0 + 1e16 + 1.0) - 1e16]
    assert len(outs) > 1  # 原子加的结果取决于谁先到


def test_missing_rows_leave_the_token_open():
    out, summed_by, counters = run_programs([[(0, 1.0)], [(4, 2.0)], [(3, 5.0)]], 2, 3)
    assert out == [None, None] and summed_by == [None, None] and counters == [1, 2]
    assert arrival_order_sum([[(0, 1.0)]], 2, 3) == [1.0, 0.0]


def test_bad_input():
    with pytest.raises(ValueError):
        run_programs([[(0, 1.0)], [(0, 2.0)]], 1, 2)  # 同一行写了两次
    with pytest.raises(ValueError):
        run_programs([[(0, 1.0), (1, 2.0)]], 1, 2)  # 一个实例替同一个 token 报到两次
    with pytest.raises(ValueError):
        run_programs([[(4, 1.0)]], 2, 2)  # 没有第 4 行
    with pytest.raises(ValueError):
        run_programs([], 1, 0)
    with pytest.raises(ValueError):
        arrival_order_sum([[(-1, 1.0)]], 1, 2)
