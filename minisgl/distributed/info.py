# Tangled from book/chapters/ch01_skeleton.ipynb — edit the notebook, not this file.
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DistributedInfo:
    """本进程在张量并行组里的位置：共 size 个进程，本进程是第 rank 个。"""

    rank: int
    size: int

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"invalid tensor-parallel position rank={self.rank} size={self.size}")

    def is_primary(self) -> bool:
        return self.rank == 0


_SINGLE = DistributedInfo(0, 1)
_TP_INFO: DistributedInfo | None = None


def set_tp_info(rank: int, size: int) -> DistributedInfo:
    """进程启动时调用一次；同一进程里不能改成别的值。"""
    global _TP_INFO
    info = DistributedInfo(rank, size)
    if _TP_INFO is not None and _TP_INFO != info:
        raise RuntimeError(f"tensor-parallel info is already {_TP_INFO}; cannot change it to {info}")
    _TP_INFO = info
    return info


def get_tp_info() -> DistributedInfo:
    """没有设置过时就是单进程：rank 0，共 1 个。"""
    return _TP_INFO or _SINGLE


def try_get_tp_info() -> DistributedInfo | None:
    return _TP_INFO
