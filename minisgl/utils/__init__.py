# Tangled from book/chapters/ch01_skeleton.ipynb — edit the notebook, not this file.
from .logger import MiniLogger, init_logger, set_log_rank
from .misc import align_down, align_ceil, div_ceil, div_even
from .registry import Registry
from .torch_utils import cpu_cores, parse_dtype, pick_device, set_num_threads, torch_dtype

__all__ = [
    "MiniLogger", "Registry", "align_down", "align_ceil", "cpu_cores", "div_ceil", "div_even", "init_logger",
    "parse_dtype", "pick_device", "set_log_rank", "set_num_threads", "torch_dtype",
]
