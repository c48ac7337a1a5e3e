# Tangled from book/chapters/ch09_continuous_batching.ipynb and ch10_chunked_prefill.ipynb — edit the notebooks, not this file.
from __future__ import annotations

from collections import deque
from typing import Deque, Dict, List, Tuple

import torch

from minisgl.core import Batch, Req
from minisgl.kvcache.radix_cache import compare_key

from .cache import CacheManager
from .table import TableManager
from .utils import PendingReq, num_outputs

# 接纳时按"现在的长度 + ratio × 还能生成的 token"估计一个请求要多少页（SGLang 的 new_token_ratio）
INIT_TOKEN_RATIO = 0.7  # 开始时、撤回过请求之后：估计每个请求用掉剩余额度的 70%
MIN_TOKEN_RATIO = 0.1  # 下限
TOKEN_RATIO_DECAY = 0.005  # 每个 decode 步降这么多：120 步从 0.7 降到 0.1
ESTIMATE_CLIP = 4096  # 剩余额度按最多这么多 token 估计（max_tokens 没给时，额度是整个上下文）
# 同一批到达、共享长前缀的请求：只让一个去算，其余的等它插进缓存
SHARE_TOKENS = 32  # 和一个正在 prefill 的请求共享的前缀，比缓存里已有的至少多这么多 token，才值得等
MAX_WAIT_STEPS = 8  # 一个请求最多让这么多步
# 正在 prefill 的提示词：命中的长度 m → 从 m 起的 SHARE_TOKENS 个 token → 这样的提示词（_should_wait 只和同组的比）
Sharing = Dict[int, Dict[Tuple[int, ...], List[torch.Tensor]]]


class PrefillManager:
    """等待队列；每步按先来先服务挑出要 prefill 的请求，受三样东西限制：token 预算、请求槽、KV 页。

    页按估计的用量接纳（第 9 章）；预算不够一整个提示词时切一块，最多一个请求处在"分块中"。
    """

    def __init__(self, cache: CacheManager, table: TableManager, running: Dict[int, Req],
                 optimistic: bool = True) -> None:
        self.cache, self.table = cache, table
        self.running = running  # 调度器的运行中请求（按接纳的先后）：估计它们还要的页
        self.optimistic = optimistic
        self.token_ratio = INIT_TOKEN_RATIO if optimistic else 1.0
        self.pending: Deque[PendingReq] = deque()
        self.chunked: Req | None = None  # 正在分块预填充的请求：已经占着槽和页

    def add(self, req: PendingReq) -> None:
        self.pending.append(req)

    def requeue(self, req: Req) -> None:
        """撤回的请求回到队首：提示词 + 已经生成的 token 作为新的输入，max_tokens 照旧。分块中的请求也可以撤回。"""
        if self.chunked is req:
            self.chunked = None
        self.pending.appendleft(PendingReq(req.uid, req.input_ids, req.sampling_params, num_outputs(req),
                                           retracted=True))

    def abort(self, uid: int) -> bool:
        """还在排队的请求直接删掉（它没占任何资源），返回 True；正在分块的请求不再接着算（它的资源由调度器
        释放），返回 False。"""
        if self.chunked is not None and self.chunked.uid == uid:
            self.chunked = None
            return False
        for p in self.pending:
            if p.uid == uid:
                self.pending.remove(p)
                return True
        return False

    # ------------------------------------------------------------------ 估计（与第 9 章相同）
    def estimate(self, length: int, final_len: int) -> float:
        """一个请求现在 length 个 token、最长 final_len 个：估计它最终的长度。"""
        if not self.optimistic:
            return final_len
        return length + self.token_ratio * min(final_len - length, ESTIMATE_CLIP)

    def on_decode_step(self) -> None:
        if self.optimistic:
            self.token_ratio = max(MIN_TOKEN_RATIO, self.token_ratio - TOKEN_RATIO_DECAY)

    def reset_token_ratio(self) -> None:
        """回到初值：空闲时，和撤回过请求之后（估计得太乐观了）。"""
        self.token_ratio = INIT_TOKEN_RATIO if self.optimistic else 1.0

    def committed_pages(self) -> int:
        """运行中的请求估计还要的页。"""
        est = self.estimate
        return sum(self.cache.pages_to_grow(r.uid, est(max(r.device_len, len(r.input_ids)), r.max_device_len))
                   for r in self.running.values())

    # ------------------------------------------------------------------ 接纳与切块
    def schedule_next_batch(self, budget: int, admit: bool = True) -> Batch | None:
        """先接着算上一步没算完的分块请求，再按先来先服务接纳新请求；预算不够一整个提示词时切一块。
        admit=False 时不接纳新请求（调度器这一步刚撤回过请求）。"""
        reqs: List[Req] = []
        if self.chunked is not None:  # 先接着算上一步没算完的那个请求；页不够时这一块切小，一页都没有就等一步
            req, P = self.chunked, self.cache.page_size
            room = self.cache.held_tokens(req.uid) + self.cache.available_pages * P - req.cached_len
            n = self._take_chunk(req, min(budget, room))
            if n > 0:
                budget -= n
                reqs.append(req)
        if admit and self.pending:
            committed = self.committed_pages()
            sharing = self._prompts_in_prefill()
            i = 0
            while i < len(self.pending) and budget > 0 and self.table.num_free > 0 and self.chunked is None:
                p = self.pending[i]
                match = self.cache.match(p.input_ids)
                if self._should_wait(p, match.handle.cached_len, sharing):
                    p.waited += 1
                    i += 1
                    continue
                idx = self.table.allocate()
                est = self.estimate(len(p.input_ids), p.final_len)
                matched = self.cache.admit(p.uid, p.input_ids, match, idx, est, committed, first=not p.retracted)
                if matched is None:  # 页不够：等运行中的请求结束再来（不跳过它，先来先服务）
                    self.table.free(idx)
                    break
                del self.pending[i]
                committed += self.cache.pages_to_grow(p.uid, est)
                req = make_req(p, idx, matched)
                budget -= self._take_chunk(req, budget)
                reqs.append(req)
                self._note_prefill(sharing, p.input_ids, matched)
        if not reqs:
            return None
        self.cache.grow(reqs)
        return Batch(reqs, "prefill")

    def _take_chunk(self, req: Req, budget: int) -> int:
        """这一步算 req 的多少个 token：剩下的全部，或者预算只够一块时的一块。返回用掉的预算。"""
        n = max(min(len(req.input_ids) - req.cached_len, budget), 0)
        req.device_len = req.cached_len + n
        self.chunked = req if req.is_chunked else None
        return n

    # ------------------------------------------------------------------ 共享前缀的请求（与第 9 章相同）
    def _share_len(self) -> int:
        return max(SHARE_TOKENS, self.cache.page_size)

    def _prompts_in_prefill(self) -> Sharing:
        """正在 prefill（还没插进缓存）的提示词，按命中的长度 m、再按从 m 起的 _share_len() 个 token 分组。"""
        groups: Sharing = {}
        if self.cache.shares_prefixes:
            for ids, matched in self.cache.prompts_in_prefill():
                self._note_prefill(groups, ids, matched)
        return groups

    def _note_prefill(self, groups: Sharing, ids: torch.Tensor, matched: int) -> None:
        """记下一个正在 prefill 的提示词：它的前 matched 个 token 命中了缓存，要算、要插进缓存的从 matched 开始。"""
        n = self._share_len()
        if self.cache.shares_prefixes and len(ids) >= matched + n:
            groups.setdefault(matched, {}).setdefault(tuple(ids[matched:matched + n].tolist()), []).append(ids)

    def _should_wait(self, p: PendingReq, matched: int, groups: Sharing) -> bool:
        """p 和某个正在 prefill 的请求 q 共享的前缀，比 p 在缓存里命中的多出至少 _share_len() 个 token：让它等 q
        插进缓存再来（最多等 MAX_WAIT_STEPS 步）。"""
        n, P = self._share_len(), self.cache.page_size
        ids_p = p.input_ids
        if p.waited >= MAX_WAIT_STEPS or len(ids_p) <= n:
            return False
        for m, by_key in groups.items():  # 不同的 m 没几个：0，和几段共同的系统提示词的长度
            if m + n > len(ids_p):
                continue
            for ids in by_key.get(tuple(ids_p[m:m + n].tolist()), ()):  # 只有在 [m, m+n) 上和 p 相同的 q 才可能
                if compare_key(ids, ids_p) // P * P - matched >= n:
                    return True
        return False


def make_req(p: PendingReq, table_idx: int, matched: int) -> Req:
    """排队的请求接纳成 Req。撤回过的请求从原来的提示词建起（max_tokens 照旧），再接上它已经生成的 token。"""
    n = len(p.input_ids) - p.num_outputs
    req = Req(p.input_ids[:n], table_idx, 0, p.sampling_params.max_tokens, p.uid, p.sampling_params)
    for token in p.input_ids[n:].tolist():
        req.append_host(token)
    req.cached_len, req.device_len = matched, len(req.input_ids)
    return req
