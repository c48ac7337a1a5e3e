# Tangled from book/chapters/ch14_multiprocess.ipynb — edit the notebook, not this file.
from .cache import CacheManager
from .config import SchedulerConfig
from .decode import DecodeManager
from .io import SchedulerIOMixin, run_scheduler_process, start_scheduler_processes
from .prefill import PrefillManager
from .scheduler import Scheduler
from .table import TableManager
from .utils import PendingReq

__all__ = ["CacheManager", "DecodeManager", "PendingReq", "PrefillManager", "Scheduler", "SchedulerConfig",
           "SchedulerIOMixin", "TableManager", "run_scheduler_process", "start_scheduler_processes"]
