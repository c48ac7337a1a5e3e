"""第 6 章练习：分页 KV 缓存的页表。

把下面每个 `raise NotImplementedError(...)` 换成你的实现。要求见同目录的 README.md。
"""
from __future__ import annotations

from typing import List


class OutOfPagesError(RuntimeError):
    """空闲页不够分配。"""


def token_slots(pages: List[int], page_size: int, start: int, end: int) -> List[int]:
    """位置 start..end-1 的 slot：第 pos 个 token 在 pages[pos // page_size] 页的第 pos % page_size 个位置。"""
    raise NotImplementedError("实现 token_slots")


def pages_needed(num_tokens: int, page_size: int) -> int:
    """放下 num_tokens 个 token 要几页（向上取整）。"""
    raise NotImplementedError("实现 pages_needed")


def grow(pages: List[int], free_pages: List[int], page_size: int, old_len: int, new_len: int) -> List[int]:
    """请求从 old_len 长到 new_len 个 token：跨页时从 free_pages 开头取页追加到 pages；返回新 token 的 slot。"""
    raise NotImplementedError("实现 grow")
