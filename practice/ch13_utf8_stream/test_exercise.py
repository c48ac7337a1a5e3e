"""ch13_utf8_stream 的测试。被测模块固定叫 solution（judge 和浏览器都会把你的代码放成 solution.py）。"""
from __future__ import annotations

import itertools
import random
from typing import List

import pytest

from solution import Utf8Stream, incomplete_tail

TEXT = "北京烤鸭🦆 is great! 👋🏽 日本語 한국어 Ünïcödé ∑∫√ 👨‍👩‍👧"


def split(data: bytes, rng: random.Random) -> List[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(0, 12)))) if len(data) > 1 else []
    return [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]


CONT = [0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF]  # 覆盖了每一种第二个字节范围的边界


def expected_tail(data: bytes) -> int:
    """对拍用：结尾 k 个字节再补上 1～3 个后续字节，能解成恰好一个字符 → 它是一个没写完的字符。"""
    for k in (3, 2, 1):
        t = data[-k:] if len(data) >= k else None
        if t is None or 0x80 <= t[0] <= 0xBF:
            continue
        for n in (1, 2, 3):
            for combo in itertools.product(CONT, repeat=n):
                try:
                    if len((t + bytes(combo)).decode("utf-8")) == 1:
                        return k
                except UnicodeDecodeError:
                    pass
    return 0


def _short(x, n: int = 48) -> str:
    r = repr(x)
    return r if len(r) <= n else r[: n - 1] + "…"


def check(data: bytes, chunks: List[bytes]) -> List[str]:
    """每送一段，已经输出的文字 == 已收到的字节去掉没写完的结尾后一次性解码的结果。
    不对时第一句就说出是哪条要求没做到（多发、多扣、内容不对、finish 不对），后面是输入。"""
    assert b"".join(chunks) == data
    s, seen, pieces = Utf8Stream(), b"", []
    for i, c in enumerate(chunks):
        out = s.feed(c)
        assert isinstance(out, str), f"feed() 应返回 str，得到 {type(out).__name__}"
        pieces.append(out)
        seen += c
        tail = expected_tail(seen)
        got, want = "".join(pieces), seen[: len(seen) - tail].decode("utf-8", errors="replace")
        if got != want:
            if want.startswith(got):
                what = f"扣多了：还少输出 {_short(want[len(got):])}"
            elif got.startswith(want):
                what = f"发多了：多输出了 {_short(got[len(want):])}（结尾没写完的 {tail} 个字节要扣着）"
            else:
                what = "输出的内容不对"
            pytest.fail(f"送完第 {i + 1}/{len(chunks)} 段（{_short(c)}）后{what}；到这里一共输出 {_short(got)}，"
                        f"应为 {_short(want)}；全部字节 {_short(data, 80)}，切成 {_short(chunks, 120)}", pytrace=False)
    pieces.append(s.finish())
    whole = data.decode("utf-8", errors="replace")
    assert "".join(pieces) == whole, (f"finish() 之后，所有输出拼起来应等于 全部字节.decode('utf-8', errors='replace') = "
                                      f"{_short(whole)}，得到 {_short(''.join(pieces))}（finish 返回 {_short(pieces[-1])}）；"
                                      f"全部字节 {_short(data, 80)}")
    return pieces


def test_examples_from_the_readme():
    assert incomplete_tail("你".encode()[:2]) == 2
    assert incomplete_tail(b"abc") == 0 and incomplete_tail("你".encode()) == 0 and incomplete_tail(b"") == 0
    assert incomplete_tail(b"\xe0\x80") == 0
    assert incomplete_tail(b"\xf0\x9f\x98") == 3


@pytest.mark.parametrize("data, n", [(b"\xc3", 1), (b"a\xe4", 1), (b"\xe4\xbd", 2), (b"\xed\xa0", 0), (b"\xed\x9f", 2),
                                     (b"\xf4\x90", 0), (b"\xf4\x8f\xbf", 3), (b"\xf0\x8f", 0), (b"\xc0", 0),
                                     (b"\xff", 0), (b"\x80", 0), (b"\xbf\xbf\xbf", 0), (b"\xe4\xbd\xa0", 0),
                                     (b"\xf0\x9f\x98\x80\xf0", 1)])
def test_incomplete_tail_ranges(data, n):
    assert incomplete_tail(data) == n


def test_byte_by_byte_never_emits_half_a_character():
    data = TEXT.encode()
    pieces = check(data, [data[i:i + 1] for i in range(len(data))])
    assert "\ufffd" not in "".join(pieces)
    assert pieces[:3] == ["", "", "北"]


def test_random_splits_of_valid_text():
    data = TEXT.encode()
    for seed in range(200):
        chunks = split(data, random.Random(seed))
        pieces = check(data, chunks)
        assert not any("\ufffd" in p for p in pieces), \
            f"输入是合法的 UTF-8，输出里却有 �：输出 {_short(pieces, 100)}；切成 {_short(chunks, 100)}"


def test_random_bytes_match_the_reference():
    for seed in range(150):
        rng = random.Random(seed)
        alphabet = list(TEXT.encode()[:40]) + [0x80, 0xBF, 0xC0, 0xC2, 0xE0, 0xED, 0xF0, 0xF4, 0xF5, 0xFF, 0x9F, 0xA0]
        data = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))
        check(data, split(data, rng))


def test_unfinished_character_at_the_end():
    s = Utf8Stream()
    assert s.feed("好".encode()[:2]) == ""
    assert s.finish() == "\ufffd"
    assert s.feed(b"ok") == "ok" and s.finish() == ""  # finish 之后从头开始
