# Tangled from book/chapters/ch11_overlap.ipynb — edit the notebook, not this file.
from __future__ import annotations

from typing import List

import torch


class TableManager:
    """请求槽（页表的行）的分配与归还，以及一张和页表同形的 token 表（第 11 章）。"""

    def __init__(self, max_running_req: int, page_table: torch.Tensor) -> None:
        self._free: List[int] = list(range(max_running_req))[::-1]  # pop() 先给小号
        self.max_running_req = max_running_req
        self.token_pool = torch.zeros_like(page_table)  # [R, S] int32：第 r 个请求槽第 s 个位置的 token

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        assert self._free, "no free request slot: check num_free first"
        return self._free.pop()

    def free(self, idx: int) -> None:
        assert idx not in self._free, f"request slot {idx} freed twice"
        self._free.append(idx)
