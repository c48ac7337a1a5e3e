"""第 4 章练习：最后到的人收尾。

把下面每个 `raise NotImplementedError(...)` 换成你的实现。要求见同目录的 README.md。
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

Program = Sequence[Tuple[int, float]]  # 一个实例写的行：[(p, value), ...]


def run_programs(programs: Sequence[Program], num_tokens: int,
                 top_k: int) -> Tuple[List[Optional[float]], List[Optional[int]], List[int]]:
    """按先后执行每个实例：写行、报到，最后到的按 k 的顺序求和。返回 (out, summed_by, counters)。"""
    raise NotImplementedError("实现 run_programs")


def arrival_order_sum(programs: Sequence[Program], num_tokens: int, top_k: int) -> List[float]:
    """对照组：每行一到就加进 out[p // top_k]，加的顺序就是到达的顺序。"""
    raise NotImplementedError("实现 arrival_order_sum")
