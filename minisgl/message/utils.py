# Tangled from book/chapters/ch12_message_zmq.ipynb — edit the notebook, not this file.
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict, FrozenSet, Tuple

import msgpack
import torch

from minisgl.core import SamplingParams

from .backend import BaseBackendMsg
from .frontend import BaseFrontendMsg
from .tokenizer import BaseTokenizerMsg

_TYPE = "__type__"
_TENSOR = "Tensor"
_PLAIN = {type(None), bool, int, float, str, bytes}  # msgpack 原样收下的类型（不含子类）：不用再递归


_KNOWN: Dict[str, type] = {}


def message_types() -> Dict[str, type]:
    """能过进程边界的 dataclass：三组消息的全部子类，加上 SamplingParams。名字 → 类。"""
    found: Dict[str, type] = {SamplingParams.__name__: SamplingParams}
    stack = [BaseBackendMsg, BaseTokenizerMsg, BaseFrontendMsg]
    while stack:
        cls = stack.pop()
        assert found.setdefault(cls.__name__, cls) is cls, f"two message classes are named {cls.__name__}"
        stack.extend(cls.__subclasses__())
    assert _TENSOR not in found, "a message class may not be called Tensor"
    _KNOWN.update(found)
    return found


def _lookup(name: str) -> type:
    cls = _KNOWN.get(name) or message_types().get(name)  # 查不到再重新收集一次：也许是刚定义的子类
    if cls is None:
        raise ValueError(f"unknown message type {name!r}; known types: {sorted(_KNOWN)}")
    return cls


def serialize_type(obj: Any) -> Any:
    """消息 → 只含 msgpack 原生类型的值：dataclass 变成带 __type__ 的字典，张量变成原始字节。"""
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return obj
    if isinstance(obj, torch.Tensor):
        return _tensor_to_dict(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        name = type(obj).__name__
        if (_KNOWN.get(name) or message_types().get(name)) is not type(obj):
            raise ValueError(f"{type(obj).__qualname__} is not a message type (only subclasses of the "
                             f"Base*Msg classes and SamplingParams travel between processes)")
        out: Dict[str, Any] = {_TYPE: name}
        for field_name in _fields(type(obj))[0]:
            v = getattr(obj, field_name)
            out[field_name] = v if type(v) in _PLAIN else serialize_type(v)
        return out
    if isinstance(obj, (list, tuple)):
        return [serialize_type(v) for v in obj]
    if isinstance(obj, dict):
        for key in obj:
            if not isinstance(key, str) or key == _TYPE:
                raise ValueError(f"message dict keys must be strings other than {_TYPE!r}, got {key!r}")
        return {k: serialize_type(v) for k, v in obj.items()}
    raise TypeError(f"cannot put a {type(obj).__name__} into a message: {obj!r:.80}")


@functools.cache
def _fields(cls: type) -> Tuple[Tuple[str, ...], FrozenSet[str]]:
    """一个消息类的全部字段名，和构造时能给的那些（init=True）：每个类只问 dataclasses 一次。"""
    fields = dataclasses.fields(cls)
    return tuple(f.name for f in fields), frozenset(f.name for f in fields if f.init)


def _tensor_to_dict(t: torch.Tensor) -> Dict[str, Any]:
    if t.device.type != "cpu":
        raise ValueError(f"only CPU tensors travel in messages, got one on {t.device}")
    flat = t.detach().contiguous().reshape(-1)
    return {_TYPE: _TENSOR, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
            "buffer": flat.view(torch.uint8).numpy().tobytes()}


def deserialize_type(data: Any) -> Any:
    """serialize_type 的逆：带 __type__ 的字典按类名还原，其余递归。"""
    if isinstance(data, list):
        return [deserialize_type(v) for v in data]
    if not isinstance(data, dict):
        return data
    name = data.get(_TYPE)
    if name is None:
        return {k: deserialize_type(v) for k, v in data.items()}
    if name == _TENSOR:
        return _dict_to_tensor(data)
    cls = _lookup(name)
    names = _fields(cls)[1]
    kwargs = {k: v if type(v) in _PLAIN else deserialize_type(v) for k, v in data.items() if k != _TYPE}
    if not kwargs.keys() <= names:
        raise ValueError(f"{name} has no fields {sorted(kwargs.keys() - names)} (fields: {sorted(names)})")
    return cls(**kwargs)


def _dict_to_tensor(data: Dict[str, Any]) -> torch.Tensor:
    dtype = getattr(torch, data["dtype"], None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown tensor dtype {data['dtype']!r} in a message")
    shape, buffer = data["shape"], data["buffer"]
    numel = 1
    for n in shape:
        numel *= n
    if len(buffer) != numel * dtype.itemsize:
        raise ValueError(f"a {data['dtype']} tensor of shape {shape} needs {numel * dtype.itemsize} bytes, "
                         f"got {len(buffer)}")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(buffer), dtype=torch.uint8).view(dtype).reshape(shape)


def encode(msg: Any) -> bytes:
    """消息 → msgpack 字节（ZMQ 队列默认用它）。"""
    return msgpack.packb(serialize_type(msg), use_bin_type=True)


def decode(data: bytes) -> Any:
    return deserialize_type(msgpack.unpackb(data, raw=False))
