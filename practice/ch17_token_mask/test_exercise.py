"""ch17_token_mask 的测试。被测模块固定叫 solution（judge 和浏览器都会把你的代码放成 solution.py）。"""
import random
import re

import pytest

from solution import apply_mask, dfa_token_mask, pack_mask, walk

INF = float("-inf")


def bit(words, token):
    return (words[token // 32] >> (token % 32)) & 1


def test_pack_mask_examples():
    assert pack_mask([0, 1], 32) == [3]
    assert pack_mask([], 33) == [0, 0]
    assert pack_mask([32], 33) == [0, 1]
    assert pack_mask([5, 5], 10) == [32]  # 重复的 id 只算一次


def test_pack_mask_uses_signed_int32():
    """第 31 位是 int32 的符号位：torch 的 int32 张量里这个字是负数。"""
    assert pack_mask([31], 32) == [-2**31]
    assert pack_mask(range(32), 32) == [-1]
    assert pack_mask([0, 1, 31], 40) == [3 - 2**31, 0]


def test_pack_mask_random_sets():
    rng = random.Random(0)
    for _ in range(50):
        vocab = rng.randint(1, 200)
        allowed = set(rng.sample(range(vocab), rng.randint(0, vocab)))
        words = pack_mask(allowed, vocab)
        assert len(words) == (vocab + 31) // 32
        assert all(-2**31 <= w < 2**31 for w in words)
        assert {t for t in range(vocab) if bit(words, t)} == allowed


def test_pack_mask_rejects_bad_input():
    with pytest.raises(ValueError, match="7"):
        pack_mask([7], 7)
    with pytest.raises(ValueError, match="-1"):
        pack_mask([-1], 7)
    with pytest.raises(ValueError, match="0"):
        pack_mask([], 0)


def test_apply_mask():
    logits = [0.5, -1.0, 2.0, 3.0]
    out = apply_mask(logits, [0b1010])
    assert out == [INF, -1.0, INF, 3.0]
    assert logits == [0.5, -1.0, 2.0, 3.0]  # 不改原列表


def test_apply_mask_ignores_bits_past_the_vocab_and_checks_width():
    logits = [float(i) for i in range(33)]
    out = apply_mask(logits, [-1, -1])  # 第二个字只有第 0 位管得着 token 32
    assert out == logits
    assert apply_mask(logits, pack_mask([32], 33)) == [INF] * 32 + [32.0]
    with pytest.raises(ValueError):
        apply_mask(logits, [-1])
    with pytest.raises(ValueError):
        apply_mask([1.0], [-1, -1])


# 只认 true 或 false 的 DFA：0 -t-> 1 -r-> 2 -u-> 3 -e-> 9；0 -f-> 4 -a-> 5 -l-> 6 -s-> 7 -e-> 9；9 是接受状态
BOOL = {0: {"t": 1, "f": 4}, 1: {"r": 2}, 2: {"u": 3}, 3: {"e": 9}, 4: {"a": 5}, 5: {"l": 6}, 6: {"s": 7},
        7: {"e": 9}}
VOCAB = ["t", "tr", "true", "f", "fa", "false", "x", "", "<eos>", "ue", "u", "rue", "alse", "truex", "e"]
EOS = 8


def test_walk():
    assert walk(BOOL, 0, "tr") == 2
    assert walk(BOOL, 0, "true") == 9
    assert walk(BOOL, 0, "") == 0
    assert walk(BOOL, 0, "tx") is None
    assert walk(BOOL, 9, "e") is None  # 接受状态之后没有边


def allowed(words):
    return [VOCAB[t] for t in range(len(VOCAB)) if bit(words, t)]


def test_dfa_token_mask_bool():
    assert allowed(dfa_token_mask(VOCAB, BOOL, {9}, 0, EOS)) == ["t", "tr", "true", "f", "fa", "false"]
    assert allowed(dfa_token_mask(VOCAB, BOOL, {9}, 2, EOS)) == ["ue", "u"]
    assert allowed(dfa_token_mask(VOCAB, BOOL, {9}, 1, EOS)) == ["rue"]
    assert allowed(dfa_token_mask(VOCAB, BOOL, {9}, 9, EOS)) == ["<eos>"]  # 走完了：只许结束


def test_dfa_token_mask_against_regex():
    """(ab)* 的 DFA：状态 0（接受）-a-> 1 -b-> 0。在状态 0，一个 token 能走通，当且仅当它是某个 (ab)^n 的前缀。"""
    ab = {0: {"a": 1}, 1: {"b": 0}}
    rng = random.Random(1)
    vocab = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 5))) for _ in range(60)] + ["<eos>"]
    eos = len(vocab) - 1
    for state, prefix in ((0, ""), (1, "a")):
        words = dfa_token_mask(vocab, ab, {0}, state, eos)
        assert len(words) == 2
        for t, text in enumerate(vocab[:-1]):
            assert bit(words, t) == bool(re.fullmatch(r"(ab)*a?", prefix + text)), (state, text)
        assert bit(words, eos) == (state == 0)
