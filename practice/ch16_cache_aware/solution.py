"""附录练习：cache_aware 路由（参考答案）。"""
from __future__ import annotations

from typing import Dict, List


class ApproxRouter:
    """每个 worker 一棵按字符的前缀树，记着发给它的请求文本。"""

    def __init__(self, workers: List[str], cache_threshold: float = 0.3, balance_abs_threshold: int = 64,
                 balance_rel_threshold: float = 1.5) -> None:
        if not workers or len(set(workers)) != len(workers):
            raise ValueError(f"workers must be non-empty and distinct, got {workers!r}")
        self.workers = list(workers)
        self.cache_threshold = cache_threshold
        self.abs_threshold, self.rel_threshold = balance_abs_threshold, balance_rel_threshold
        self.trees: Dict[str, dict] = {w: {} for w in workers}
        self.sizes: Dict[str, int] = {w: 0 for w in workers}

    def _check(self, worker: str) -> None:
        if worker not in self.trees:
            raise ValueError(f"unknown worker {worker!r}")

    def match(self, worker: str, text: str) -> int:
        self._check(worker)
        node, n = self.trees[worker], 0
        for ch in text:
            if ch not in node:
                break
            node, n = node[ch], n + 1
        return n

    def tree_size(self, worker: str) -> int:
        self._check(worker)
        return self.sizes[worker]

    def _insert(self, worker: str, text: str) -> None:
        node = self.trees[worker]
        for ch in text:
            if ch not in node:
                node[ch] = {}
                self.sizes[worker] += 1
            node = node[ch]

    def route(self, text: str, loads: Dict[str, int]) -> str:
        if set(loads) != set(self.workers):
            raise ValueError(f"loads must name exactly the workers {self.workers}, got {sorted(loads)}")
        hi, lo = max(loads.values()), min(loads.values())
        if hi - lo > self.abs_threshold and hi > lo * self.rel_threshold:
            chosen = min(self.workers, key=lambda w: loads[w])  # min 取第一个最小的：并列取靠前的
        else:
            rates = [self.match(w, text) / len(text) if text else 0.0 for w in self.workers]
            best = max(range(len(rates)), key=lambda i: (rates[i], -i))
            if rates[best] > self.cache_threshold:
                chosen = self.workers[best]
            else:
                chosen = min(self.workers, key=lambda w: self.sizes[w])
        self._insert(chosen, text)
        return chosen
