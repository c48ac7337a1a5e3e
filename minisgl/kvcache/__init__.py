# Tangled from book/chapters/ch06_kvcache.ipynb — edit the notebook, not this file.
from .base import BaseKVCachePool
from .mha_pool import MHAKVCache

__all__ = ["BaseKVCachePool", "MHAKVCache"]
