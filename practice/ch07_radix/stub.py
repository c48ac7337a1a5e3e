"""第 7 章练习：基数树。

把下面每个 `raise NotImplementedError(...)` 换成你的实现。要求见同目录的 README.md。
可以自由添加辅助函数、类和属性；下面几个公开方法的名字和参数不能改。
"""
from __future__ import annotations

from typing import List


class RadixTree:
    """token 序列 → 每个 token 的值（KV 槽号）。共享前缀只存一份。"""

    def __init__(self) -> None:
        raise NotImplementedError("实现 RadixTree.__init__")

    def match(self, tokens: List[int]) -> List[int]:
        """最长的已缓存前缀的值（每个 token 一个）；路上的节点都算"刚用过"。"""
        raise NotImplementedError("实现 match")

    def insert(self, tokens: List[int], values: List[int]) -> int:
        """收下 tokens 和它们的值，返回开头有几个 token 原来就在树里（这几个的值保持原样）。"""
        raise NotImplementedError("实现 insert")

    def size(self) -> int:
        """树里一共缓存了几个 token。"""
        raise NotImplementedError("实现 size")

    def edges(self) -> List[List[int]]:
        """除根以外每个节点的 key（一段 token），排好序。"""
        raise NotImplementedError("实现 edges")

    def evict(self, n: int) -> List[int]:
        """按 LRU 淘汰叶子（整个节点），直到至少淘汰 n 个 token；返回被淘汰的值。"""
        raise NotImplementedError("实现 evict")
