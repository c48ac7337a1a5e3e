"""ch12_message 的测试。被测模块固定叫 solution（judge 和浏览器都会把你的代码放成 solution.py）。"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import pytest

from solution import deserialize, serialize


@dataclass
class Params:
    temperature: float = 0.0
    stop: List[str] = field(default_factory=list)
    seed: Optional[int] = None


@dataclass
class Request:
    uid: int
    prompt: str
    params: Params
    payload: bytes = b""


@dataclass
class Batch:
    data: List[Any]
    meta: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Empty:
    pass


TYPES = {cls.__name__: cls for cls in (Params, Request, Batch, Empty)}


def via_json(obj: Any) -> Any:
    return deserialize(json.loads(json.dumps(serialize(obj))), TYPES)


def test_example_from_the_readme():
    assert serialize(Request(1, "hi", Params(), b"\x00\xff")) == {
        "__type__": "Request", "uid": 1, "prompt": "hi",
        "params": {"__type__": "Params", "temperature": 0.0, "stop": [], "seed": None},
        "payload": {"__type__": "bytes", "b64": "AP8="}}


def test_round_trip_nested():
    msg = Batch([Request(7, "北京在哪里？😀", Params(0.7, ["\n\n", "。"], 2**62), bytes(range(256))),
                 Empty(), Batch([], {"x": [1, 2.5, None, True]}), "plain", None],
                {"enable_thinking": False, "nested": {"a": [b"\x01"]}})
    assert via_json(msg) == msg


def test_scalars_keep_their_types():
    got = via_json([True, False, 0, 1, -3, 1.5, "", None])
    assert got == [True, False, 0, 1, -3, 1.5, "", None]
    assert [type(v) for v in got] == [bool, bool, int, int, int, float, str, type(None)]


def test_tuples_become_lists_and_fields_keep_order():
    assert serialize((1, (2, 3))) == [1, [2, 3]]
    assert list(serialize(Params())) == ["__type__", "temperature", "stop", "seed"]


def test_random_bytes():
    rng = random.Random(0)
    for n in [0, 1, 2, 3, 100, 1001]:
        data = bytes(rng.randrange(256) for _ in range(n))
        out = serialize(data)
        assert out["__type__"] == "bytes" and isinstance(out["b64"], str)
        assert via_json(data) == data


def test_missing_fields_use_defaults():
    assert deserialize({"__type__": "Request", "uid": 1, "prompt": "p", "params": {"__type__": "Params"}},
                       TYPES) == Request(1, "p", Params())


def test_errors():
    with pytest.raises(ValueError, match="Shutdown"):
        deserialize({"__type__": "Shutdown"}, TYPES)
    with pytest.raises(ValueError, match="colour"):
        deserialize({"__type__": "Params", "colour": "red"}, TYPES)
    with pytest.raises(ValueError, match="__type__"):
        serialize({"role": "user", "__type__": "Empty"})
    with pytest.raises(ValueError, match="1"):
        serialize({1: "a"})
    with pytest.raises(TypeError, match="set"):
        serialize(Batch([{1, 2}]))
    with pytest.raises(TypeError):
        serialize(Params)  # 类本身不是消息
