"""第 4 章练习：补齐到块、按专家排队。

把下面每个 `raise NotImplementedError(...)` 换成你的实现。要求见同目录的 README.md。
"""
from __future__ import annotations

from typing import List, Optional, Tuple


def num_blocks(num_pairs: int, num_experts: int, bm: int) -> int:
    """块数的上界：⌈P/BM⌉ + min(E, P)。"""
    raise NotImplementedError("实现 num_blocks")


def align(experts: List[int], num_experts: int, bm: int) -> Tuple[List[Optional[int]], List[int], List[int]]:
    """(rows, block_expert, starts)：每个专家一段、段长补齐到 bm 的倍数；用不上的块的专家是 -1。"""
    raise NotImplementedError("实现 align")
