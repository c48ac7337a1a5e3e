# Tangled from book/chapters/ch09_continuous_batching.ipynb — edit the notebook, not this file.
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Tuple

import torch

from minisgl.core import Req
from minisgl.kvcache import BaseCacheHandle, MatchResult, create_prefix_cache


@dataclass
class _ReqPages:
    handle: BaseCacheHandle  # 锁着的缓存位置：前 handle.cached_len 个 token 的页属于前缀缓存
    pages: List[int]  # 自己的页，按位置顺序，从 handle.cached_len 开始
    prompt: torch.Tensor | None  # prefill 还没算完时的提示词；算完、插进缓存之后为 None


class PageCounts(NamedTuple):
    used: int  # 运行中的请求在用的页：自己的，加上它们锁住的缓存页
    cached: int  # 只在前缀缓存里、没有运行中的请求在用的页：需要时可以淘汰
    free: int  # 空闲列表上的页


class CacheManager:
    """页的分配：空闲页、前缀缓存（命中、插入、淘汰）和页表的写入。

    每一页在任何时刻恰好在三处之一：空闲列表、前缀缓存、某个请求自己的页。请求用到的缓存页被它锁着，不会被淘汰。
    """

    def __init__(self, page_table: torch.Tensor, num_pages: int, page_size: int, cache_type: str) -> None:
        self.page_table = page_table  # [R, S] int32，设备上
        self.num_pages, self.page_size = num_pages, page_size
        self.prefix_cache = create_prefix_cache(cache_type, page_table.device, page_size)
        self.shares_prefixes = cache_type != "naive"  # naive 什么都不缓存，等别人插进缓存也没用
        self.free_pages: List[int] = list(range(num_pages))[::-1]
        self.hit_tokens = 0  # 请求第一次被接纳时，提示词命中前缀缓存的 token 数（累计）
        self._reqs: Dict[int, _ReqPages] = {}

    @property
    def available_pages(self) -> int:
        """现在就能拿到的页：空闲的 + 前缀缓存里没被锁住、可以淘汰的。"""
        return len(self.free_pages) + self.prefix_cache.size_info.evictable_size // self.page_size

    def page_counts(self) -> PageCounts:
        cached = self.prefix_cache.size_info.evictable_size // self.page_size
        free = len(self.free_pages)
        return PageCounts(self.num_pages - free - cached, cached, free)

    def match(self, input_ids: torch.Tensor) -> MatchResult:
        """input_ids 在前缀缓存里命中的最长前缀（整页；没有锁住）。至少留最后一个 token 去算 logits。"""
        return self.prefix_cache.match_prefix(input_ids[:len(input_ids) - 1])

    def admit(self, uid: int, input_ids: torch.Tensor, match: MatchResult, table_idx: int, est_len: float,
              committed: int, first: bool = True) -> int | None:
        """接纳一个新请求：锁住命中的前缀；它估计会长到 est_len 个 token，还差的页加上已经答应出去的 committed 页
        放得下时，命中的槽写进页表，返回命中的 token 数；放不下时什么都不改，返回 None。first：第一次接纳（不是
        撤回后再来），命中的才算进 hit_tokens。"""
        self.prefix_cache.lock_handle(match.handle)  # 先锁：锁住的部分不再算作可淘汰
        matched = match.handle.cached_len
        if math.ceil(est_len / self.page_size) - matched // self.page_size > self.available_pages - committed:
            self.prefix_cache.lock_handle(match.handle, unlock=True)
            return None
        if first:
            self.hit_tokens += matched
        self._reqs[uid] = _ReqPages(match.handle, [], input_ids)
        if matched:
            self.page_table[table_idx, :matched] = match.indices
        return matched

    def held_tokens(self, uid: int) -> int:
        """请求 uid 的前多少个位置已经有槽：命中（锁着）的缓存页加上自己的页。"""
        st = self._reqs[uid]
        return st.handle.cached_len + len(st.pages) * self.page_size

    def pages_to_grow(self, uid: int, length: float) -> int:
        """请求 uid 要让前 length 个位置都有槽，还差几页。"""
        return max(0, math.ceil((length - self.held_tokens(uid)) / self.page_size))

    def prompts_in_prefill(self) -> List[Tuple[torch.Tensor, int]]:
        """已经接纳、prefill 还没算完的请求：(提示词, 命中的前缀长度)。它们算完就会插进前缀缓存。"""
        return [(st.prompt, st.handle.cached_len) for st in self._reqs.values() if st.prompt is not None]

    def grow(self, reqs: List[Req]) -> None:
        """保证每个请求的前 device_len 个位置都有槽：跨页时拿一页（空闲列表空了就淘汰缓存）；整批的页表写入合成一次。"""
        P = self.page_size
        rows: List[int] = []
        cols: List[int] = []
        pages: List[int] = []
        for req in reqs:
            st = self._reqs[req.uid]
            have = self.held_tokens(req.uid)
            while have < req.device_len:
                page = self._take_page()
                st.pages.append(page)
                rows.append(req.table_idx)
                cols.append(have)
                pages.append(page)
                have += P
        if pages:
            offs = torch.arange(P)
            r = torch.tensor(rows)[:, None].expand(-1, P)  # [N, P]
            c = torch.tensor(cols)[:, None] + offs  # [N, P]
            slots = (torch.tensor(pages)[:, None] * P + offs).int()  # [N, P]
            host = torch.stack([r.flatten(), c.flatten().int(), slots.flatten()]).int()  # [3, N·P]：一次拷贝
            # non_blocking：阻塞的 .to(cuda) 会等 GPU 把排着的工作做完，第 11 章的重叠就没了
            rows_d, cols_d, slots_d = host.to(self.page_table.device, non_blocking=True).unbind(0)
            self.page_table[rows_d, cols_d] = slots_d

    def cache_prompt(self, req: Req) -> None:
        """prefill 刚算完：提示词的整页插进前缀缓存，请求改锁新的位置——这些页从请求手里转给缓存，请求接着用，
        后来的请求从这一刻起就能命中它们。"""
        st = self._reqs[req.uid]
        st.prompt = None
        P, m = self.page_size, st.handle.cached_len
        n = min(req.cached_len, len(req.input_ids)) // P * P  # 有 K/V 的整页
        if n <= m or not self.shares_prefixes:
            return
        if self.prefix_cache.match_prefix(req.input_ids[:n]).handle.cached_len > m:
            return  # 别的请求刚插进了同样的前缀：现在插，我们这份就成了重复的页——留给 release 处理
        res = self.prefix_cache.insert_prefix(req.input_ids[:n], self.page_table[req.table_idx, :n])
        assert res.cached_len == m, f"{req.uid=} {res.cached_len=} {m=}"
        self.prefix_cache.lock_handle(res.handle)
        self.prefix_cache.lock_handle(st.handle, unlock=True)
        st.pages = st.pages[(res.handle.cached_len - m) // P:]
        st.handle = res.handle

    def release(self, req: Req) -> None:
        """请求结束、中止或被撤回：算过的整页插进前缀缓存，重复的页和零头还回空闲列表，解锁。"""
        st = self._reqs.pop(req.uid)
        P, m = self.page_size, st.handle.cached_len
        n = min(req.cached_len, len(req.input_ids)) // P * P  # 有 K/V 的整页
        res = self.prefix_cache.insert_prefix(req.input_ids[:n], self.page_table[req.table_idx, :n])
        dup_end = (res.cached_len - m) // P  # [m, res.cached_len)：缓存里已经有了，我们这份是重复的
        kept_end = max(res.handle.cached_len - m, 0) // P  # [res.cached_len, handle.cached_len)：缓存收下了
        self.free_pages.extend(st.pages[:dup_end] + st.pages[max(kept_end, dup_end):])
        self.prefix_cache.lock_handle(st.handle, unlock=True)

    def flush(self) -> None:
        """把前缀缓存里能淘汰的全部淘汰（没有运行中的请求时，缓存就空了）。"""
        size = self.prefix_cache.size_info.evictable_size
        if size:
            self.free_pages.extend(self._pages_of(self.prefix_cache.evict(size)))

    def _take_page(self) -> int:
        if not self.free_pages:
            self.free_pages.extend(self._pages_of(self.prefix_cache.evict(self.page_size)))
        return self.free_pages.pop()

    def _pages_of(self, slots: torch.Tensor) -> List[int]:
        return (slots[::self.page_size] // self.page_size).tolist()

    def check_integrity(self) -> None:
        """每一页恰好在一处：空闲、缓存、某个请求。测试在每一步之后调用。"""
        self.prefix_cache.check_integrity()
        cached = self.prefix_cache.size_info.total_size // self.page_size
        owned = [p for st in self._reqs.values() for p in st.pages]
        assert len(self.free_pages) + cached + len(owned) == self.num_pages, \
            f"pages leak: free {len(self.free_pages)} + cached {cached} + owned {len(owned)} != {self.num_pages}"
        assert len(set(self.free_pages) | set(owned)) == len(self.free_pages) + len(owned), "a page is in two places"
