"""第 4 章练习：补齐到块、按专家排队（参考答案）。"""
from __future__ import annotations

from typing import List, Optional, Tuple


def num_blocks(num_pairs: int, num_experts: int, bm: int) -> int:
    """块数的上界：⌈P/BM⌉ + min(E, P)。"""
    if num_pairs < 1 or num_experts < 1 or bm < 1:
        raise ValueError(f"num_pairs={num_pairs}, num_experts={num_experts}, bm={bm}: all must be >= 1")
    return -(-num_pairs // bm) + min(num_experts, num_pairs)


def align(experts: List[int], num_experts: int, bm: int) -> Tuple[List[Optional[int]], List[int], List[int]]:
    """(rows, block_expert, starts)：每个专家一段、段长补齐到 bm 的倍数；用不上的块的专家是 -1。"""
    bad = [e for e in experts if not 0 <= e < num_experts]
    if bad:
        raise ValueError(f"expert ids {bad[:3]} are outside 0..{num_experts - 1}")
    blocks = num_blocks(len(experts), num_experts, bm)
    counts = [0] * num_experts
    for e in experts:
        counts[e] += 1
    starts, row = [], 0
    for n in counts:  # 每段补齐到 bm 的倍数，依次排开
        starts.append(row)
        row += -(-n // bm) * bm
    rows: List[Optional[int]] = [None] * (blocks * bm)
    filled = [0] * num_experts
    for p, e in enumerate(experts):  # 按编号 p 的顺序放：段里也是 p 从小到大
        rows[starts[e] + filled[e]] = p
        filled[e] += 1
    block_expert = [-1] * blocks
    for e in range(num_experts):
        for b in range(starts[e] // bm, (starts[e] + -(-counts[e] // bm) * bm) // bm):
            block_expert[b] = e
    return rows, block_expert, starts
