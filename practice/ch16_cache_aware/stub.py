"""附录练习：cache_aware 路由。

把下面每个 `raise NotImplementedError(...)` 换成你的实现。要求见同目录的 README.md。
可以自由添加辅助函数和属性；下面几个公开方法的名字和参数不能改。
"""
from __future__ import annotations

from typing import Dict, List


class ApproxRouter:
    """每个 worker 一棵按字符的前缀树，记着发给它的请求文本。"""

    def __init__(self, workers: List[str], cache_threshold: float = 0.3, balance_abs_threshold: int = 64,
                 balance_rel_threshold: float = 1.5) -> None:
        raise NotImplementedError("实现 __init__")

    def match(self, worker: str, text: str) -> int:
        """text 与发给过这个 worker 的某个文本的最长公共前缀的字符数。"""
        raise NotImplementedError("实现 match")

    def tree_size(self, worker: str) -> int:
        """这个 worker 的前缀树的节点数：发给它的文本的不同非空前缀的个数。"""
        raise NotImplementedError("实现 tree_size")

    def route(self, text: str, loads: Dict[str, int]) -> str:
        """选一个 worker，把 text 记进它的树，返回它的名字。"""
        raise NotImplementedError("实现 route")
