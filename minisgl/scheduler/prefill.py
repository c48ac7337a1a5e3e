# Tangled from book/chapters/ch09_continuous_batching.ipynb and ch10_chunked_prefill.ipynb — edit the notebooks, not this file.
from __future__ import annotations

from collections import deque
from typing import Deque, List

from minisgl.core import Batch, Req

from .cache import CacheManager
from .table import TableManager
from .utils import PendingReq


class PrefillManager:
    """等待队列；每步按先来先服务挑出要 prefill 的请求，受三样东西限制：token 预算、请求槽、KV 页。"""

    def __init__(self, cache: CacheManager, table: TableManager) -> None:
        self.cache, self.table = cache, table
        self.pending: Deque[PendingReq] = deque()
        self.chunked: Req | None = None  # 正在分块预填充的请求：已经占着槽和页

    def add(self, req: PendingReq) -> None:
        self.pending.append(req)

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

    def schedule_next_batch(self, budget: int) -> Batch | None:
        """先接着算上一步没算完的分块请求，再按先来先服务接纳新请求；预算不够一整个提示词时切一块。"""
        reqs: List[Req] = []
        if self.chunked is not None:  # 先接着算上一步没算完的那个请求
            req, self.chunked = self.chunked, None
            budget -= self._take_chunk(req, budget)
            reqs.append(req)
        while self.pending and budget > 0 and self.table.num_free > 0:
            p = self.pending[0]
            idx = self.table.allocate()
            matched = self.cache.admit(p.uid, p.input_ids, idx, len(p.input_ids) + p.sampling_params.max_tokens)
            if matched is None:  # 页不够：等运行中的请求结束再来（不跳过它，先来先服务）
                self.table.free(idx)
                break
            self.pending.popleft()
            req = Req(p.input_ids, idx, matched, p.sampling_params.max_tokens, p.uid, p.sampling_params)
            budget -= self._take_chunk(req, budget)
            reqs.append(req)
        if not reqs:
            return None
        self.cache.grow(reqs)
        return Batch(reqs, "prefill")

    def _take_chunk(self, req: Req, budget: int) -> int:
        """这一步算 req 的多少个 token：剩下的全部，或者预算只够一块时的一块。返回用掉的预算。"""
        n = min(len(req.input_ids) - req.cached_len, budget)
        req.device_len = req.cached_len + n
        if req.is_chunked:
            self.chunked = req
        return n
