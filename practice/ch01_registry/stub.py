"""第 1 章练习：名字到实现的注册表。

把下面每个 `raise NotImplementedError(...)` 换成你的实现。要求见同目录的 README.md。
"""
from __future__ import annotations

from typing import Callable, Dict, Generic, List, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """把字符串名字映射到一个实现（函数或类）。

    >>> backends = Registry("attention backend")
    >>> @backends.register("torch")
    ... def make_torch():
    ...     return "torch"
    >>> backends.get("torch")() == "torch"
    True
    """

    def __init__(self, kind: str) -> None:
        # kind 只用于报错信息，例如 "attention backend"
        self.kind = kind
        # 提示：每个 Registry 实例要有自己的字典
        raise NotImplementedError("实现 Registry.__init__：准备一个只属于这个实例的字典")

    def register(self, name: str) -> Callable[[T], T]:
        """返回一个装饰器：把被装饰的对象登记在 name 下，并原样返回它。

        name 已经登记过 → ValueError（信息里要有这个名字），原来的登记保持不变。
        """
        raise NotImplementedError("实现 Registry.register")

    def get(self, name: str) -> T:
        """取出 name 对应的实现。

        不认识的名字 → ValueError，信息里要有这个名字，以及按字母序排好的全部已知名字。
        """
        raise NotImplementedError("实现 Registry.get")

    def __getitem__(self, name: str) -> T:
        """registry[name]：和 get(name) 完全一样（包括报错）。"""
        raise NotImplementedError("实现 Registry.__getitem__")

    def names(self) -> List[str]:
        """全部已登记的名字，按字母序排序。"""
        raise NotImplementedError("实现 Registry.names")

    def __contains__(self, name: object) -> bool:
        """name in registry。"""
        raise NotImplementedError("实现 Registry.__contains__")

    def __len__(self) -> int:
        """已登记的个数。"""
        raise NotImplementedError("实现 Registry.__len__")
