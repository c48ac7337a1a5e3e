# Tangled from book/chapters/ch05_tensor_parallel.ipynb — edit the notebook, not this file.
from .impl import (all_gather, all_reduce, destroy_distributed, free_tcp_address, init_distributed,
                   kv_head_range, shard_range, vocab_range)
from .info import DistributedInfo, get_tp_info, set_tp_info, try_get_tp_info

__all__ = [
    "DistributedInfo", "all_gather", "all_reduce", "destroy_distributed", "free_tcp_address", "get_tp_info",
    "init_distributed", "kv_head_range", "set_tp_info", "shard_range", "try_get_tp_info", "vocab_range",
]
