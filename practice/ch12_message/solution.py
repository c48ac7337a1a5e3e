"""第 12 章练习：嵌套 dataclass ↔ 带 __type__ 的 JSON 字典（参考答案）。"""
from __future__ import annotations

import base64
import dataclasses
from typing import Any, Dict

TYPE = "__type__"


def serialize(obj: Any) -> Any:
    """obj → json.dumps 能直接处理的值：dataclass 变成带 __type__ 的字典，bytes 变成 base64。"""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, bytes):
        return {TYPE: "bytes", "b64": base64.b64encode(obj).decode("ascii")}
    if isinstance(obj, (list, tuple)):
        return [serialize(v) for v in obj]
    if isinstance(obj, dict):
        for key in obj:
            if not isinstance(key, str) or key == TYPE:
                raise ValueError(f"dict keys must be strings other than {TYPE!r}, got {key!r}")
        return {k: serialize(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: Dict[str, Any] = {TYPE: type(obj).__name__}
        for f in dataclasses.fields(obj):
            out[f.name] = serialize(getattr(obj, f.name))
        return out
    raise TypeError(f"cannot serialize a {type(obj).__name__}")


def deserialize(data: Any, types: Dict[str, type]) -> Any:
    """serialize 的逆；types 是类名 → dataclass 类。"""
    if isinstance(data, list):
        return [deserialize(v, types) for v in data]
    if not isinstance(data, dict):
        return data
    name = data.get(TYPE)
    if name is None:
        return {k: deserialize(v, types) for k, v in data.items()}
    if name == "bytes":
        return base64.b64decode(data["b64"])
    if name not in types:
        raise ValueError(f"unknown type {name!r}")
    cls = types[name]
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: deserialize(v, types) for k, v in data.items() if k != TYPE}
    extra = sorted(kwargs.keys() - names)
    if extra:
        raise ValueError(f"{name} has no fields {extra}")
    return cls(**kwargs)
