"""第 12 章练习：嵌套 dataclass ↔ 带 __type__ 的 JSON 字典。

把下面每个 `raise NotImplementedError(...)` 换成你的实现。要求见同目录的 README.md。
"""
from __future__ import annotations

import base64
import dataclasses
from typing import Any, Dict

TYPE = "__type__"


def serialize(obj: Any) -> Any:
    """obj → json.dumps 能直接处理的值：dataclass 变成带 __type__ 的字典，bytes 变成 base64。"""
    raise NotImplementedError("实现 serialize")


def deserialize(data: Any, types: Dict[str, type]) -> Any:
    """serialize 的逆；types 是类名 → dataclass 类。"""
    raise NotImplementedError("实现 deserialize")
