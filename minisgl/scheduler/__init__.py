# Tangled from book/chapters/ch09_continuous_batching.ipynb — edit the notebook, not this file.
from .cache import CacheManager
from .config import SchedulerConfig
from .decode import DecodeManager
from .prefill import PrefillManager
from .scheduler import Scheduler
from .table import TableManager
from .utils import PendingReq

__all__ = ["CacheManager", "DecodeManager", "PendingReq", "PrefillManager", "Scheduler", "SchedulerConfig",
           "TableManager"]
