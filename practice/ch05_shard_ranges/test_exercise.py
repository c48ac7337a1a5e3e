"""ch05_shard_ranges 的测试。被测模块固定叫 solution（judge 和浏览器都会把你的代码放成 solution.py）。"""
import pytest

from solution import even_range, kv_head_range, merged_ranges, vocab_range


@pytest.mark.parametrize("n, tp", [(8, 1), (8, 2), (12, 4), (6, 6)])
def test_even_range_tiles_exactly(n, tp):
    ranges = [even_range(n, tp, r) for r in range(tp)]
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    for (a, b), (c, d) in zip(ranges, ranges[1:]):
        assert b == c
    assert {b - a for a, b in ranges} == {n // tp}


def test_even_range_rejects_uneven():
    with pytest.raises(ValueError) as info:
        even_range(10, 4, 0)
    msg = str(info.value)
    assert "--tp" in msg and "4" in msg and "10" in msg


def test_merged_ranges_gate_up():
    assert merged_ranges([4, 4], 2, 0) == [(0, 2), (4, 6)]
    assert merged_ranges([4, 4], 2, 1) == [(2, 4), (6, 8)]


def test_merged_ranges_qkv_like_blocks():
    # q 有 8 行、k 和 v 各 4 行，tp=4：每个 rank 每块拿 2 / 1 / 1 行
    assert merged_ranges([8, 4, 4], 4, 3) == [(6, 8), (11, 12), (15, 16)]


def test_merged_ranges_is_not_a_plain_chunk():
    # 常见错误：直接把合并后的矩阵平均切，rank 0 就拿到了 gate 的全部、up 的一点也没有
    assert merged_ranges([6, 6], 2, 0) != [(0, 6)]


def test_merged_ranges_covers_everything_once():
    sizes, tp = [6, 2, 2], 2
    rows = sorted(i for r in range(tp) for a, b in merged_ranges(sizes, tp, r) for i in range(a, b))
    assert rows == list(range(sum(sizes)))


def test_merged_ranges_rejects_uneven_block():
    with pytest.raises(ValueError):
        merged_ranges([8, 3], 2, 0)


@pytest.mark.parametrize("kv, tp, want", [
    (8, 2, [(0, 4), (4, 8)]),
    (4, 4, [(0, 1), (1, 2), (2, 3), (3, 4)]),
    (2, 4, [(0, 1), (0, 1), (1, 2), (1, 2)]),     # 复制：rank 0、1 共用头 0
    (1, 2, [(0, 1), (0, 1)]),
    (2, 8, [(0, 1)] * 4 + [(1, 2)] * 4),
])
def test_kv_head_range(kv, tp, want):
    assert [kv_head_range(kv, tp, r) for r in range(tp)] == want


@pytest.mark.parametrize("kv, tp", [(4, 3), (3, 2), (2, 3), (4, 6)])
def test_kv_head_range_rejects(kv, tp):
    with pytest.raises(ValueError) as info:
        kv_head_range(kv, tp, 0)
    assert "--tp" in str(info.value)


@pytest.mark.parametrize("vocab, tp, want", [
    (10, 2, [(0, 5), (5, 10)]),
    (10, 3, [(0, 4), (4, 8), (8, 10)]),
    (10, 4, [(0, 3), (3, 6), (6, 9), (9, 10)]),
    (5, 4, [(0, 2), (2, 4), (4, 5), (5, 5)]),       # 最后一个 rank 一行也没有
    (7, 1, [(0, 7)]),
])
def test_vocab_range(vocab, tp, want):
    assert [vocab_range(vocab, tp, r) for r in range(tp)] == want


def test_vocab_range_every_id_owned_once():
    for vocab in range(1, 40):
        for tp in range(1, 9):
            owners = [0] * vocab
            for r in range(tp):
                a, b = vocab_range(vocab, tp, r)
                assert 0 <= a <= b <= vocab
                for i in range(a, b):
                    owners[i] += 1
            assert owners == [1] * vocab, (vocab, tp)
