"""ch15_sse 的测试。被测模块固定叫 solution（judge 和浏览器都会把你的代码放成 solution.py）。"""
from __future__ import annotations

import json
import random
from typing import List

from solution import SSEParser, encode_chunk, encode_event, read_choices, read_openai_stream

TEXTS = ["北京", "烤鸭🦆", " is", "\n\n", "great!", "", " 👋🏽", "a: b", " two  spaces", "data: x"]


def split(data: bytes, rng: random.Random) -> List[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(0, 20)))) if len(data) > 1 else []
    return [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]


def test_encode_event() -> None:
    assert encode_event("hello") == b"data: hello\n\n"
    assert encode_event("a\nb") == b"data: a\ndata: b\n\n"
    assert encode_event("") == b"data: \n\n"
    assert encode_event("你好") == "data: 你好\n\n".encode()


def test_encode_chunk() -> None:
    raw = encode_chunk(3, "烤鸭", None)
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n") and raw.count(b"\n") == 2
    obj = json.loads(raw[len(b"data: "):].decode())
    assert obj == {"id": "chatcmpl-3", "object": "chat.completion.chunk",
                   "choices": [{"index": 0, "delta": {"content": "烤鸭"}, "finish_reason": None}]}
    assert "烤鸭" in raw.decode()  # ensure_ascii=False
    end = json.loads(encode_chunk(3, "", "stop")[6:])
    assert end["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop"}


def test_parser_fields_and_line_endings() -> None:
    p = SSEParser()
    assert p.feed(b"data: a\n\n") == ["a"]
    assert p.feed(b": keep-alive\n\ndata:b\r\ndata:  c\r\n\r\n") == ["b\n c"]
    assert p.feed(b"event: x\nid: 7\nretry: 10\ndata\n\n") == [""]
    assert p.feed(b"event: only\n\n") == []  # 没有 data：不产生事件
    assert p.feed(b"data: one\rdata: two\r\r") == ["one\ntwo"]
    assert p.feed(b"data: x: y\n\n") == ["x: y"]
    assert p.feed(b"data: unfinished\n") == []  # 还没有空行


def test_parser_any_split() -> None:
    events = [json.dumps({"t": t}, ensure_ascii=False) for t in TEXTS] + ["multi\nline", "[DONE]"]
    for seed in range(200):
        rng = random.Random(seed)
        eol = rng.choice(["\n", "\r\n", "\r"])
        raw = b"".join(encode_event(e).replace(b"\n", eol.encode()) + (b": ping\n\n" if rng.random() < 0.3 else b"")
                       for e in events)
        p, got = SSEParser(), []
        for piece in split(raw, rng):
            got += p.feed(piece)
        assert got == events, f"seed {seed}"


def test_parser_is_incremental() -> None:
    p = SSEParser()
    raw = encode_event("你好")
    assert p.feed(raw[:8]) == [] and p.feed(raw[8:-1]) == [] and p.feed(raw[-1:]) == ["你好"]
    p = SSEParser()
    assert p.feed(b"data: a\r") == [] and p.feed(b"\n") == [] and p.feed(b"\r\n") == ["a"]


def test_read_openai_stream() -> None:
    for seed in range(50):
        rng = random.Random(seed)
        parts = [rng.choice(TEXTS) for _ in range(rng.randint(0, 12))]
        raw = b"".join(encode_chunk(1, t, None) for t in parts) + encode_chunk(1, "", "length")
        raw += encode_event(json.dumps({"choices": [], "usage": {"completion_tokens": len(parts)}}))
        raw += encode_event("[DONE]") + b"data: {not json after DONE}\n\n"
        assert read_openai_stream(split(raw, rng)) == ("".join(parts), "length"), f"seed {seed}"


def choice_chunk(i: int, text: str, finish_reason: str | None) -> bytes:
    delta = {"content": text} if text else {}
    return encode_event(json.dumps({"choices": [{"index": i, "delta": delta, "finish_reason": finish_reason}]},
                                   ensure_ascii=False))


def test_read_choices_interleaved() -> None:
    for seed in range(50):
        rng = random.Random(seed)
        n = rng.randint(1, 4)
        answers = [[rng.choice(TEXTS) for _ in range(rng.randint(0, 6))] for _ in range(n)]
        reasons = [rng.choice(["stop", "length"]) for _ in range(n)]
        queues = [[choice_chunk(i, t, None) for t in a] + [choice_chunk(i, "", reasons[i])]
                  for i, a in enumerate(answers)]
        raw = b""
        while any(queues):  # 随机交错，每个回答内部保持顺序
            q = rng.choice([q for q in queues if q])
            raw += q.pop(0)
        raw += encode_event(json.dumps({"choices": [], "usage": {}})) + encode_event("[DONE]")
        assert read_choices(split(raw, rng)) == [("".join(a), r) for a, r in zip(answers, reasons)], f"seed {seed}"


def test_read_choices_rejects_a_chunk_after_finish() -> None:
    raw = (choice_chunk(0, "a", None) + choice_chunk(1, "", "stop") + choice_chunk(1, "late", None)
           + encode_event("[DONE]"))
    try:
        read_choices([raw])
    except ValueError as e:
        assert "1" in str(e)
    else:
        raise AssertionError("a chunk after choice 1's finish_reason was accepted")
