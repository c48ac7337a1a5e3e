"""第 15 章练习：SSE 的分帧。

把下面每个 `raise NotImplementedError(...)` 换成你的实现。要求见同目录的 README.md。
可以自由添加辅助函数和属性；下面几个公开函数、方法的名字和参数不能改。
"""
from __future__ import annotations

import json
from typing import Iterable, List, Tuple


def encode_event(data: str) -> bytes:
    """一个 SSE 事件：每行一个 data:，最后一个空行。"""
    raise NotImplementedError("实现 encode_event")


def encode_chunk(uid: int, text: str, finish_reason: str | None) -> bytes:
    """一个 /v1/chat/completions 的流式片段，编码成 SSE 事件。"""
    raise NotImplementedError("实现 encode_chunk")


class SSEParser:
    """字节一段一段地进来，完整的事件一个一个地出去。"""

    def __init__(self) -> None:
        raise NotImplementedError("实现 SSEParser.__init__")

    def feed(self, chunk: bytes) -> List[str]:
        raise NotImplementedError("实现 feed")


def read_openai_stream(chunks: Iterable[bytes]) -> Tuple[str, str | None]:
    """读完一个 OpenAI 流：(拼起来的 delta.content, 最后的 finish_reason)。"""
    raise NotImplementedError("实现 read_openai_stream")


def read_choices(chunks: Iterable[bytes]) -> List[Tuple[str, str | None]]:
    """读完一个 n > 1 的 OpenAI 流：每个回答的 (全文, finish_reason)，按 index 排。"""
    raise NotImplementedError("实现 read_choices")
