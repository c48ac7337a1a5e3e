# Tangled from book/chapters/ch06_kvcache.ipynb — edit the notebook, not this file.
from .store import store_cache

__all__ = ["store_cache"]
