# Tangled from book/chapters/ch09_continuous_batching.ipynb — edit the notebook, not this file.
from __future__ import annotations

from typing import Dict, List

from minisgl.core import Batch, Req

from .cache import CacheManager


class DecodeManager:
    """prefill 完的请求：每步各 decode 一个 token。"""

    def __init__(self) -> None:
        self.running: Dict[int, Req] = {}  # uid → Req，按加入的顺序

    def add(self, req: Req) -> None:
        self.running[req.uid] = req

    def remove(self, req: Req) -> None:
        self.running.pop(req.uid, None)

    def ready(self) -> List[Req]:
        """这一步能 decode 的请求（长度到头的请求在上一步就结束了）。"""
        return [r for r in self.running.values() if r.remain_len > 0]

    def schedule_next_batch(self, cache: CacheManager) -> Batch | None:
        reqs = self.ready()
        if not reqs:
            return None
        cache.grow(reqs)
        return Batch(reqs, "decode")
