"""ch08_sampling 的测试。被测模块固定叫 solution（judge 和浏览器都会把你的代码放成 solution.py）。"""
import math

import pytest

from solution import capture_sizes, penalize, pick_bucket, sampling_probs

LOG = [math.log(p) for p in (0.5, 0.3, 0.2)]


def close(a, b):
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) for x, y in zip(a, b))


def test_plain_softmax():
    probs = sampling_probs([0.0, math.log(3.0)])
    assert close(probs, [0.25, 0.75])


def test_temperature_flattens_and_sharpens():
    logits = [0.0, 2.0]
    hot, base, cold = (sampling_probs(logits, temperature=t)[1] for t in (2.0, 1.0, 0.5))
    assert math.isclose(base, 1 / (1 + math.exp(-2)))
    assert math.isclose(hot, 1 / (1 + math.exp(-1)))
    assert math.isclose(cold, 1 / (1 + math.exp(-4)))


def test_large_logits_do_not_overflow():
    probs = sampling_probs([1000.0, 1000.0 - math.log(3.0)])
    assert close(probs, [0.75, 0.25])


def test_greedy_is_one_hot_first_max():
    assert sampling_probs([1.0, 3.0, 3.0, 2.0], temperature=0) == [0.0, 1.0, 0.0, 0.0]
    assert sampling_probs([-5.0, -7.0], temperature=0.0, top_k=1, top_p=0.1) == [1.0, 0.0]


def test_top_k():
    probs = sampling_probs([math.log(p) for p in (0.1, 0.4, 0.2, 0.3)], top_k=2)
    assert close(probs, [0.0, 4 / 7, 0.0, 3 / 7])


def test_top_k_larger_than_vocab_keeps_all():
    assert close(sampling_probs(LOG, top_k=10), [0.5, 0.3, 0.2])


def test_top_k_ties_keep_lower_index():
    probs = sampling_probs([2.0, 1.0, 2.0, 2.0], top_k=2)
    assert close(probs, [0.5, 0.0, 0.5, 0.0])


def test_top_p_example():
    assert close(sampling_probs(LOG, top_p=0.6), [0.625, 0.375, 0.0])


def test_top_p_small_keeps_the_first():
    assert close(sampling_probs(LOG, top_p=0.01), [1.0, 0.0, 0.0])


def test_top_p_ties_keep_lower_index():
    assert close(sampling_probs([0.0, 0.0, 0.0, 0.0], top_p=0.3), [0.5, 0.5, 0.0, 0.0])


def test_top_p_applies_to_what_top_k_left():
    # top-k=2 之后是 [0.4/0.7, 0.3/0.7] ≈ [0.571, 0.429]：top_p=0.55 只留第一个
    logits = [math.log(p) for p in (0.1, 0.4, 0.2, 0.3)]
    assert close(sampling_probs(logits, top_k=2, top_p=0.55), [0.0, 1.0, 0.0, 0.0])
    # 不先做 top-k 的话，0.4 不够 0.55，会留两个
    assert close(sampling_probs(logits, top_p=0.55), [0.0, 4 / 7, 0.0, 3 / 7])


def test_top_p_one_keeps_every_token():
    # 2000 个词：概率按顺序累加起来，浮点的和可能略超过 1——top_p=1.0 也一个都不能截
    logits = [math.sin(i) * 5 for i in range(2000)]
    probs = sampling_probs(logits, temperature=0.7, top_p=1.0)
    assert all(p > 0 for p in probs)
    assert close(probs, sampling_probs(logits, temperature=0.7))


def test_temperature_before_filters():
    # temperature=0.5 把 [0.5, 0.3, 0.2] 变成正比于 [0.25, 0.09, 0.04]；top_p=0.6 时 0.25/0.38 ≈ 0.658 已经够了
    assert close(sampling_probs(LOG, temperature=0.5, top_p=0.6), [1.0, 0.0, 0.0])


@pytest.mark.parametrize("kwargs, bad", [
    (dict(temperature=-0.5), "-0.5"),
    (dict(top_k=0), "0"),
    (dict(top_k=-2), "-2"),
    (dict(top_p=0.0), "0"),
    (dict(top_p=1.5), "1.5"),
])
def test_bad_parameters(kwargs, bad):
    with pytest.raises(ValueError) as info:
        sampling_probs(LOG, **kwargs)
    assert bad in str(info.value)


def test_empty_logits():
    with pytest.raises(ValueError):
        sampling_probs([])


def test_repetition_divides_positive_and_multiplies_negative():
    got = penalize([2.0, -1.0, 0.5, 3.0], prompt_ids=[0, 1], output_ids=[1, 1], repetition=2.0)
    assert close(got, [1.0, -2.0, 0.5, 3.0])  # 词 1 出现了三次，也只罚一次


def test_presence_and_frequency_count_only_generated_tokens():
    got = penalize([1.0, 1.0, 1.0, 1.0], prompt_ids=[0, 0, 3], output_ids=[2, 2, 2, 3], presence=0.5, frequency=0.25)
    assert close(got, [1.0, 1.0, 1.0 - 0.5 - 0.75, 1.0 - 0.5 - 0.25])


def test_repetition_before_presence():
    got = penalize([4.0, -4.0], prompt_ids=[], output_ids=[0, 1], presence=1.0, repetition=2.0)
    assert close(got, [4.0 / 2 - 1.0, -4.0 * 2 - 1.0])


def test_penalize_leaves_the_input_alone_and_checks_arguments():
    logits = [1.0, 2.0]
    assert penalize(logits, [], []) == [1.0, 2.0] and logits == [1.0, 2.0]
    penalize(logits, [0], [1], presence=1.0, repetition=1.5)
    assert logits == [1.0, 2.0]
    with pytest.raises(ValueError):
        penalize(logits, [], [], repetition=0.0)
    with pytest.raises(ValueError):
        penalize(logits, [5], [])


@pytest.mark.parametrize("max_bs, want", [
    (0, []),
    (1, [1]),
    (3, [1, 2]),
    (8, [1, 2, 4, 8]),
    (20, [1, 2, 4, 8, 16]),
    (32, [1, 2, 4, 8, 16, 24, 32]),
])
def test_capture_sizes(max_bs, want):
    assert capture_sizes(max_bs) == want


def test_capture_sizes_large():
    sizes = capture_sizes(256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 256 and len(sizes) == 3 + 32


def test_capture_sizes_rejects_negative():
    with pytest.raises(ValueError):
        capture_sizes(-1)


@pytest.mark.parametrize("bs, want", [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 16), (16, 16), (17, None), (100, None)])
def test_pick_bucket(bs, want):
    assert pick_bucket(bs, [1, 2, 4, 8, 16]) == want


def test_pick_bucket_against_capture_sizes():
    sizes = capture_sizes(64)
    for bs in range(1, 65):
        b = pick_bucket(bs, sizes)
        assert b in sizes and b >= bs
        assert all(s < bs for s in sizes if s < b)
    assert pick_bucket(65, sizes) is None


def test_pick_bucket_no_graphs_and_bad_bs():
    assert pick_bucket(1, []) is None
    with pytest.raises(ValueError):
        pick_bucket(0, [1, 2])
