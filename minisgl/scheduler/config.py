# Tangled from book/chapters/ch11_overlap.ipynb — edit the notebook, not this file.
from __future__ import annotations

from dataclasses import dataclass

from minisgl.engine import EngineConfig
from minisgl.kvcache import PREFIX_CACHES


@dataclass(frozen=True)
class SchedulerConfig(EngineConfig):
    """引擎的配置，加上调度器自己的：一步最多 prefill 多少 token、用哪种前缀缓存、是否重叠调度。"""

    max_extend_tokens: int = 8192  # --max-prefill-length
    cache_type: str = "radix"  # --cache
    enable_overlap: bool = True  # 第 11 章：CPU 准备第 N+1 步时，GPU 在算第 N 步

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_extend_tokens < 1:
            raise ValueError(f"--max-prefill-length {self.max_extend_tokens} is invalid: it must be >= 1")
        if self.cache_type not in PREFIX_CACHES:
            raise ValueError(f"--cache {self.cache_type!r} is invalid: choose one of {PREFIX_CACHES.names()}")
