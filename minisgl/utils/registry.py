# Tangled from book/chapters/ch01_skeleton.ipynb — edit the notebook, not this file.
from __future__ import annotations

from typing import Callable, Dict, Generic, List, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """名字 → 工厂。register 拒绝重名；查不到时报出所有可选的名字。"""

    def __init__(self, what: str) -> None:
        self.what = what
        self._items: Dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.what} {name!r} is already registered")
            self._items[name] = item
            return item  # 原样返回：被装饰的名字在模块里照常可用

        return decorator

    def get(self, name: str) -> T:
        if name not in self._items:
            raise ValueError(f"unknown {self.what} {name!r}; choose one of {self.names()}")
        return self._items[name]

    def names(self) -> List[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
