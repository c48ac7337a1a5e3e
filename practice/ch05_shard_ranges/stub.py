"""第 5 章练习：张量并行的切分范围。

把下面每个 `raise NotImplementedError(...)` 换成你的实现。要求见同目录的 README.md。
"""
from __future__ import annotations

from typing import List, Tuple

Range = Tuple[int, int]  # 左闭右开 [start, end)


def even_range(n: int, tp: int, rank: int) -> Range:
    """长度 n 平均切成 tp 段的第 rank 段；除不尽 → ValueError（信息里有 --tp 和 n）。"""
    raise NotImplementedError("实现 even_range")


def merged_ranges(sizes: List[int], tp: int, rank: int) -> List[Range]:
    """竖着拼起来的几块各自平均切；返回这个 rank 在完整合并矩阵里的每一段行区间。"""
    raise NotImplementedError("实现 merged_ranges")


def kv_head_range(num_kv_heads: int, tp: int, rank: int) -> Range:
    """tp <= 头数：平均切；tp > 头数：每个 rank 一个头（复制），第 rank * num_kv_heads // tp 个。"""
    raise NotImplementedError("实现 kv_head_range")


def vocab_range(vocab_size: int, tp: int, rank: int) -> Range:
    """每个 rank ceil(vocab_size / tp) 行，越界部分截掉；start <= end <= vocab_size。"""
    raise NotImplementedError("实现 vocab_range")
