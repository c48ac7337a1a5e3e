# Tangled from book/chapters/ch01_skeleton.ipynb — edit the notebook, not this file.
from .info import DistributedInfo, get_tp_info, set_tp_info, try_get_tp_info

__all__ = ["DistributedInfo", "get_tp_info", "set_tp_info", "try_get_tp_info"]
