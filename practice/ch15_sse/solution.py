"""第 15 章练习：SSE 的分帧（参考答案）。"""
from __future__ import annotations

import json
from typing import Dict, Iterable, List, Tuple


def encode_event(data: str) -> bytes:
    """一个 SSE 事件：每行一个 data:，最后一个空行。"""
    return ("".join(f"data: {line}\n" for line in data.split("\n")) + "\n").encode("utf-8")


def encode_chunk(uid: int, text: str, finish_reason: str | None) -> bytes:
    """一个 /v1/chat/completions 的流式片段，编码成 SSE 事件。"""
    delta = {"content": text} if text else {}
    chunk = {"id": f"chatcmpl-{uid}", "object": "chat.completion.chunk",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
    return encode_event(json.dumps(chunk, ensure_ascii=False))


class SSEParser:
    """字节一段一段地进来，完整的事件一个一个地出去。"""

    def __init__(self) -> None:
        self.buf = b""  # 还没有行尾的字节
        self.data: List[str] = []  # 当前事件已经收到的 data 行
        self.after_cr = False  # 上一行以 \r 结束：紧跟着的一个 \n 属于同一个行尾

    def feed(self, chunk: bytes) -> List[str]:
        self.buf += chunk
        events: List[str] = []
        while self.buf:
            if self.after_cr and self.buf[:1] == b"\n":
                self.buf = self.buf[1:]
            self.after_cr = False
            ends = [i for i in (self.buf.find(b"\n"), self.buf.find(b"\r")) if i >= 0]
            if not ends:
                break
            end = min(ends)
            self.after_cr = self.buf[end:end + 1] == b"\r"
            line, self.buf = self.buf[:end].decode("utf-8", errors="replace"), self.buf[end + 1:]
            self._line(line, events)
        return events

    def _line(self, line: str, events: List[str]) -> None:
        if line == "":
            if self.data:
                events.append("\n".join(self.data))
            self.data = []
            return
        if line.startswith(":"):
            return
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self.data.append(value)


def read_openai_stream(chunks: Iterable[bytes]) -> Tuple[str, str | None]:
    """读完一个 OpenAI 流：(拼起来的 delta.content, 最后的 finish_reason)。"""
    parser, text, reason = SSEParser(), [], None
    for chunk in chunks:
        for data in parser.feed(chunk):
            if data == "[DONE]":
                return "".join(text), reason
            obj = json.loads(data)
            if not obj.get("choices"):
                continue
            choice = obj["choices"][0]
            text.append(choice.get("delta", {}).get("content") or "")
            if choice.get("finish_reason") is not None:
                reason = choice["finish_reason"]
    return "".join(text), reason


def read_choices(chunks: Iterable[bytes]) -> List[Tuple[str, str | None]]:
    """读完一个 n > 1 的 OpenAI 流：每个回答的 (全文, finish_reason)，按 index 排。"""
    parser = SSEParser()
    texts: Dict[int, List[str]] = {}
    reasons: Dict[int, str | None] = {}
    for chunk in chunks:
        for data in parser.feed(chunk):
            if data == "[DONE]":
                return [("".join(texts.get(i, [])), reasons.get(i)) for i in range(max(texts, default=-1) + 1)]
            obj = json.loads(data)
            for choice in obj.get("choices") or []:
                i = choice["index"]
                if reasons.get(i) is not None:
                    raise ValueError(f"choice {i} has a chunk after its finish_reason")
                texts.setdefault(i, []).append(choice.get("delta", {}).get("content") or "")
                reasons[i] = choice.get("finish_reason")
    return [("".join(texts.get(i, [])), reasons.get(i)) for i in range(max(texts, default=-1) + 1)]
