"""第 1 章练习：名字到实现的注册表（参考答案）。"""
from __future__ import annotations

from typing import Callable, Dict, Generic, List, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """把字符串名字映射到一个实现（函数或类）。"""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: Dict[str, T] = {}  # 实例属性：两个 Registry 互不干扰

    def register(self, name: str) -> Callable[[T], T]:
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is already registered")

        def decorator(obj: T) -> T:
            # 装饰时再检查一次：同一个装饰器对象被用了两次也要报错
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj  # 原样返回，被装饰的函数照常可用

        return decorator

    def get(self, name: str) -> T:
        if name not in self._items:
            known = ", ".join(self.names()) or "(none)"
            raise ValueError(f"unknown {self.kind} {name!r}; known: {known}")
        return self._items[name]

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def names(self) -> List[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __len__(self) -> int:
        return len(self._items)
