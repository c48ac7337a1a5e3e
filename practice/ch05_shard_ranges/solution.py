"""第 5 章练习：张量并行的切分范围（参考答案）。"""
from __future__ import annotations

from typing import List, Tuple

Range = Tuple[int, int]


def even_range(n: int, tp: int, rank: int) -> Range:
    if n % tp:
        raise ValueError(f"--tp {tp} must divide n={n}")
    per = n // tp
    return rank * per, (rank + 1) * per


def merged_ranges(sizes: List[int], tp: int, rank: int) -> List[Range]:
    out, offset = [], 0
    for n in sizes:
        start, end = even_range(n, tp, rank)
        out.append((offset + start, offset + end))
        offset += n
    return out


def kv_head_range(num_kv_heads: int, tp: int, rank: int) -> Range:
    if tp <= num_kv_heads:
        if num_kv_heads % tp:
            raise ValueError(f"--tp {tp} must divide num_key_value_heads={num_kv_heads}")
        return even_range(num_kv_heads, tp, rank)
    if tp % num_kv_heads:
        raise ValueError(f"--tp {tp} must be a multiple of num_key_value_heads={num_kv_heads}")
    head = rank * num_kv_heads // tp
    return head, head + 1


def vocab_range(vocab_size: int, tp: int, rank: int) -> Range:
    per = -(-vocab_size // tp)  # 向上取整
    start = min(rank * per, vocab_size)
    return start, min(start + per, vocab_size)
