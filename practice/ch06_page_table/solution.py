"""第 6 章练习：分页 KV 缓存的页表（参考答案）。"""
from __future__ import annotations

from typing import List


class OutOfPagesError(RuntimeError):
    """空闲页不够分配。"""


def token_slots(pages: List[int], page_size: int, start: int, end: int) -> List[int]:
    """位置 start..end-1 的 slot：第 pos 个 token 在 pages[pos // page_size] 页的第 pos % page_size 个位置。"""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    if end < start:
        raise ValueError(f"end ({end}) < start ({start})")
    capacity = len(pages) * page_size
    if end > capacity:
        raise ValueError(f"end={end} exceeds the {len(pages)} pages * page_size {page_size} = {capacity} tokens")
    return [pages[pos // page_size] * page_size + pos % page_size for pos in range(start, end)]


def pages_needed(num_tokens: int, page_size: int) -> int:
    """放下 num_tokens 个 token 要几页（向上取整）。"""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    return (num_tokens + page_size - 1) // page_size


def grow(pages: List[int], free_pages: List[int], page_size: int, old_len: int, new_len: int) -> List[int]:
    """请求从 old_len 长到 new_len 个 token：跨页时从 free_pages 开头取页追加到 pages；返回新 token 的 slot。"""
    if new_len < old_len:
        raise ValueError(f"new_len ({new_len}) < old_len ({old_len})")
    have = pages_needed(old_len, page_size)
    if len(pages) != have:
        raise ValueError(f"a request of {old_len} tokens holds {have} pages of {page_size}, got {len(pages)}")
    extra = pages_needed(new_len, page_size) - have
    if extra > len(free_pages):
        raise OutOfPagesError(f"need {extra} new pages, only {len(free_pages)} free")
    pages.extend(free_pages[:extra])
    del free_pages[:extra]
    return token_slots(pages, page_size, old_len, new_len)
