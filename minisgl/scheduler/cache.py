# Tangled from book/chapters/ch09_continuous_batching.ipynb — edit the notebook, not this file.
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import torch

from minisgl.core import Req
from minisgl.kvcache import BaseCacheHandle, create_prefix_cache
from minisgl.utils import div_ceil


@dataclass
class _ReqPages:
    handle: BaseCacheHandle  # 前缀缓存里命中的位置（锁着）
    matched_len: int  # 命中的 token 数：这部分的页属于前缀缓存
    pages: List[int]  # 自己的页，按位置顺序，从 matched_len 开始
    reserved: int  # 预留了、还没拿走的页数


class CacheManager:
    """页的分配：空闲页、前缀缓存（命中、插入、淘汰）和页表的写入。

    每一页在任何时刻恰好在三处之一：空闲列表、前缀缓存、某个请求自己的页。
    接纳请求时按它一生最多要用的页数预留，decode 途中永远不会缺页。
    """

    def __init__(self, page_table: torch.Tensor, num_pages: int, page_size: int, cache_type: str) -> None:
        self.page_table = page_table  # [R, S] int32，设备上
        self.num_pages, self.page_size = num_pages, page_size
        self.prefix_cache = create_prefix_cache(cache_type, page_table.device, page_size)
        self.free_pages: List[int] = list(range(num_pages))[::-1]
        self.reserved = 0  # 所有请求预留、还没拿走的页
        self.hit_tokens = 0  # 前缀缓存命中的 token 数（累计）
        self._reqs: Dict[int, _ReqPages] = {}

    @property
    def available_pages(self) -> int:
        """还能答应给新请求的页：空闲的 + 前缀缓存里可以淘汰的 − 已经答应别人的。"""
        evictable = self.prefix_cache.size_info.evictable_size // self.page_size
        return len(self.free_pages) + evictable - self.reserved

    def admit(self, uid: int, input_ids: torch.Tensor, table_idx: int, total_len: int) -> int | None:
        """为一个新请求匹配前缀并预留它一生的页；成功返回命中的 token 数（已写进页表），放不下返回 None。"""
        match = self.prefix_cache.match_prefix(input_ids[:len(input_ids) - 1])  # 至少留一个 token 去算 logits
        self.prefix_cache.lock_handle(match.handle)  # 先锁：锁住的部分不再算作可淘汰
        matched = match.handle.cached_len
        need = div_ceil(total_len, self.page_size) - matched // self.page_size
        if need > self.available_pages:
            self.prefix_cache.lock_handle(match.handle, unlock=True)
            return None
        self.reserved += need
        self.hit_tokens += matched
        self._reqs[uid] = _ReqPages(match.handle, matched, [], need)
        if matched:
            self.page_table[table_idx, :matched] = match.indices
        return matched

    def grow(self, reqs: List[Req]) -> None:
        """保证每个请求的前 device_len 个位置都有槽：跨页时从预留里拿页；整批的页表写入合成一次。"""
        P = self.page_size
        rows: List[int] = []
        cols: List[int] = []
        pages: List[int] = []
        for req in reqs:
            st = self._reqs[req.uid]
            have = st.matched_len + len(st.pages) * P
            while have < req.device_len:
                page = self._take_page()
                st.pages.append(page)
                st.reserved -= 1
                self.reserved -= 1
                assert st.reserved >= 0, f"request {req.uid} outgrew its reservation"
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

    def release(self, req: Req, insert: bool = True) -> None:
        """请求结束或中止：算过的整页插进前缀缓存，重复的页和零头还回空闲列表，解锁，退掉没用完的预留。"""
        st = self._reqs.pop(req.uid)
        P, m = self.page_size, st.matched_len
        free = st.pages
        if insert:
            n = req.cached_len // P * P  # 有 K/V 的整页
            res = self.prefix_cache.insert_prefix(req.input_ids[:n], self.page_table[req.table_idx, :n])
            dup_end = (res.cached_len - m) // P  # [m, res.cached_len)：缓存里已经有了，我们这份是重复的
            kept_end = max(res.handle.cached_len - m, 0) // P  # [res.cached_len, handle.cached_len)：缓存收下了
            free = st.pages[:dup_end] + st.pages[max(kept_end, dup_end):]
        self.free_pages.extend(free)
        self.prefix_cache.lock_handle(st.handle, unlock=True)
        self.reserved -= st.reserved

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
        cached = self.prefix_cache.size_info.total_size // self.page_size
        owned = sum(len(st.pages) for st in self._reqs.values())
        assert len(self.free_pages) + cached + owned == self.num_pages, \
            f"pages leak: free {len(self.free_pages)} + cached {cached} + owned {owned} != {self.num_pages}"
        assert len(set(self.free_pages)) == len(self.free_pages), "a page is free twice"
        assert self.reserved == sum(st.reserved for st in self._reqs.values()) and self.available_pages >= 0
