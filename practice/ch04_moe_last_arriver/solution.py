"""第 4 章练习：最后到的人收尾（参考答案）。"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

Program = Sequence[Tuple[int, float]]  # 一个实例写的行：[(p, value), ...]


def _check(programs: Sequence[Program], num_tokens: int, top_k: int) -> None:
    if num_tokens < 1 or top_k < 1:
        raise ValueError(f"num_tokens={num_tokens}, top_k={top_k}: both must be >= 1")
    seen = set()
    for i, program in enumerate(programs):
        tokens = set()
        for p, _ in program:
            if not 0 <= p < num_tokens * top_k:
                raise ValueError(f"program {i}: pair {p} is outside 0..{num_tokens * top_k - 1}")
            if p in seen:
                raise ValueError(f"program {i}: pair {p} is written twice")
            if p // top_k in tokens:
                raise ValueError(f"program {i}: two rows of token {p // top_k}")
            seen.add(p)
            tokens.add(p // top_k)


def run_programs(programs: Sequence[Program], num_tokens: int,
                 top_k: int) -> Tuple[List[Optional[float]], List[Optional[int]], List[int]]:
    """按先后执行每个实例：写行、报到，最后到的按 k 的顺序求和。返回 (out, summed_by, counters)。"""
    _check(programs, num_tokens, top_k)
    rows: List[Optional[float]] = [None] * (num_tokens * top_k)
    out: List[Optional[float]] = [None] * num_tokens
    summed_by: List[Optional[int]] = [None] * num_tokens
    counters = [0] * num_tokens
    for i, program in enumerate(programs):
        for p, value in program:  # 1. 先写完自己的全部行
            rows[p] = value
        for p, _ in program:  # 2. 再给每一行的 token 报到
            t = p // top_k
            before, counters[t] = counters[t], counters[t] + 1
            if before == top_k - 1:  # 3. 最后一个到：按 k 的顺序相加（计数器留在 K，下次调用前有人清零）
                total = 0.0
                for j in range(top_k):
                    total += rows[t * top_k + j]
                out[t], summed_by[t] = total, i
    return out, summed_by, counters


def arrival_order_sum(programs: Sequence[Program], num_tokens: int, top_k: int) -> List[float]:
    """对照组：每行一到就加进 out[p // top_k]，加的顺序就是到达的顺序。"""
    _check(programs, num_tokens, top_k)
    out = [0.0] * num_tokens
    for program in programs:
        for p, value in program:
            out[p // top_k] += value
    return out
