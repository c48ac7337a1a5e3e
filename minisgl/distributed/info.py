# Tangled from book/chapters/ch01_skeleton.ipynb — edit the notebook, not this file.
from __future__ import annotations

from dataclasses import dataclass

from minisgl.utils.logger import set_log_rank


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


_TP_INFO: DistributedInfo | None = None


def set_tp_info(rank: int, size: int) -> DistributedInfo:
    """进程启动时调用一次（单进程就是 set_tp_info(0, 1)）；同一进程里不能改成别的值。顺便告诉日志本进程的 rank。"""
    global _TP_INFO
    info = DistributedInfo(rank, size)
    if _TP_INFO is not None and _TP_INFO != info:
        raise RuntimeError(f"tensor-parallel info is already {_TP_INFO}; cannot change it to {info}")
    _TP_INFO = info
    set_log_rank(rank, size)
    return info


def get_tp_info() -> DistributedInfo:
    """本进程的 TP 位置；还没有 set_tp_info 过就报错，而不是猜一个。"""
    if _TP_INFO is None:
        raise RuntimeError("tensor-parallel info is not set: call set_tp_info(rank, size) at process start "
                           "(set_tp_info(0, 1) for a single process)")
    return _TP_INFO


def try_get_tp_info() -> DistributedInfo | None:
    """和 get_tp_info 一样，但没有设置过时返回 None。"""
    return _TP_INFO
