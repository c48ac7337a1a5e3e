# Tangled from book/chapters/ch08_engine.ipynb — edit the notebook, not this file.
from .decode import split_kv_decode, split_kv_splits, split_kv_supported
from .fused import qk_norm_rope_store, qk_norm_rope_store_supported
from .matmul import gemv, gemv_supported
from .sample import race_sample, race_sample_supported, warm_race_sample
from .store import store_cache

__all__ = ["gemv", "gemv_supported", "qk_norm_rope_store", "qk_norm_rope_store_supported", "race_sample",
           "race_sample_supported", "split_kv_decode", "split_kv_splits", "split_kv_supported", "store_cache",
           "warm_race_sample"]
