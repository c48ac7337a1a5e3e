# Tangled from book/chapters/ch14_multiprocess.ipynb — edit the notebook, not this file.
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from minisgl.engine import EngineConfig
from minisgl.kvcache import PREFIX_CACHES


@dataclass(frozen=True)
class SchedulerConfig(EngineConfig):
    """引擎的配置，加上调度器自己的：prefill 预算、前缀缓存、重叠调度，以及服务进程的 ZMQ 地址（第 14 章）。"""

    max_extend_tokens: int = 8192  # --max-prefill-length
    cache_type: str = "radix"  # --cache
    # optimistic：按估计的用量接纳，页不够时撤回请求；reserve：按一生的上限预留，永远不撤回（第 9 章）
    admission: Literal["optimistic", "reserve"] = "optimistic"
    enable_overlap: bool = True  # 第 11 章：CPU 准备第 N+1 步时，GPU 在算第 N 步
    # 第 14 章：服务进程的 ZMQ 地址（第 15 章的 ServerArgs 填上）；离线的 LLM 都是 None
    zmq_backend_addr: str | None = None  # tokenizer → 调度器 rank 0（rank 0 bind 这个 PULL）
    zmq_detokenizer_addr: str | None = None  # 调度器 rank 0 → detokenizer
    zmq_broadcast_addr: str | None = None  # TP > 1：rank 0 → 其他 rank（PUB/SUB）

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_extend_tokens < 1:
            raise ValueError(f"--max-prefill-length {self.max_extend_tokens} is invalid: it must be >= 1")
        if self.cache_type not in PREFIX_CACHES:
            raise ValueError(f"--cache {self.cache_type!r} is invalid: choose one of {PREFIX_CACHES.names()}")
        if self.admission not in ("optimistic", "reserve"):
            raise ValueError(f"admission={self.admission!r} is invalid: choose 'optimistic' or 'reserve'")
