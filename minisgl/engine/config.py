# Tangled from book/chapters/ch08_engine.ipynb — edit the notebook, not this file.
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from minisgl.distributed import DistributedInfo
from minisgl.moe import MOE_BACKENDS
from minisgl.utils import pick_device

_DTYPES = ("auto", "float32", "bfloat16", "float16")
# 整数字段 → 能不能是 None。离线的 LLM(**config) 直接填这些字段，不经过 argparse：先看类型，再看范围
_INTEGERS = {"page_size": True, "num_pages": True, "cpu_kv_memory_mb": False, "max_running_req": False,
             "max_seq_len_override": True, "cuda_graph_max_bs": False, "random_seed": True, "num_threads": True}


@dataclass(frozen=True)
class EngineConfig:
    """一个 TP rank 上的引擎需要知道的一切。两边都有的字段名与 upstream 相同（upstream 的 `num_page_override`
    这里叫 `num_pages`），flag 是第 15 章命令行里的名字。"""

    model_path: str | Path
    tp_info: DistributedInfo = field(default_factory=lambda: DistributedInfo(0, 1))
    dtype: str = "auto"  # auto：GPU 上 bfloat16，CPU 上 float32
    device: str = "auto"  # auto：有 CUDA 用 cuda，否则 cpu
    page_size: int | None = None  # None：GPU 上 16（FlashInfer 按页读，基准测得最快），CPU 上 1
    num_pages: int | None = None  # None：GPU 上按 memory_ratio，CPU 上按 cpu_kv_memory_mb
    memory_ratio: float = 0.9  # GPU 上权重 + KV 池最多占总显存的比例
    cpu_kv_memory_mb: int = 2048
    max_running_req: int = 256
    max_seq_len_override: int | None = None
    attention_backend: str = "auto"  # auto：GPU 上 fi（装了 flashinfer 时），否则 torch
    moe_backend: str = "auto"  # auto：GPU 上装了 Triton 时 triton（能录进 CUDA Graph），否则 torch
    cuda_graph_max_bs: int = 256  # 0：不录 CUDA Graph
    dist_init_addr: str | None = None  # TP > 1 时各 rank 会合的地址，如 tcp://127.0.0.1:29500
    random_seed: int | None = None  # 没给 seed 的请求用它派生的随机数；None：启动时随机选一个
    num_threads: int | None = None  # torch 用几个 CPU 线程；None：CPU 上是这个进程能用的核数，GPU 上是 1
    use_dummy_weight: bool = False  # 不读权重文件，按配置随机初始化（压测用）
    cpu_onednn: bool = True  # CPU、float32：线性层和 LM head 的权重换成 oneDNN 预先排好的格式（False：F.linear，作对照）

    def __post_init__(self) -> None:
        for name, optional in _INTEGERS.items():  # bool 也是 int 的子类：page_size=True 不算整数
            value = getattr(self, name)
            if not ((optional and value is None) or (isinstance(value, int) and not isinstance(value, bool))):
                raise TypeError(f"{name}={value!r} must be an integer" + (" or None" if optional else ""))
        if isinstance(self.memory_ratio, bool) or not isinstance(self.memory_ratio, (int, float)):
            raise TypeError(f"memory_ratio={self.memory_ratio!r} must be a number")
        if self.page_size is None:  # 按设备定下来：之后读 config.page_size 的地方拿到的总是整数
            object.__setattr__(self, "page_size", 16 if pick_device(self.device).type == "cuda" else 1)
        moe = ("auto", *MOE_BACKENDS.names())
        checks = [("--dtype", self.dtype, self.dtype in _DTYPES, f"one of {_DTYPES}"),
                  ("--moe-backend", self.moe_backend, self.moe_backend in moe, f"one of {moe}"),  # 只有 MoE 模型才建它
                  ("--page-size", self.page_size, self.page_size >= 1, ">= 1"),
                  ("--num-pages", self.num_pages, self.num_pages is None or self.num_pages >= 1, ">= 1"),
                  ("--memory-ratio", self.memory_ratio, 0 < self.memory_ratio <= 1, "in (0, 1]"),
                  ("--cpu-kv-memory-mb", self.cpu_kv_memory_mb, self.cpu_kv_memory_mb >= 1, ">= 1"),
                  ("--max-running-requests", self.max_running_req, self.max_running_req >= 1, ">= 1"),
                  ("--max-seq-len-override", self.max_seq_len_override,
                   self.max_seq_len_override is None or self.max_seq_len_override >= 2, ">= 2"),
                  ("--cuda-graph-max-bs", self.cuda_graph_max_bs, self.cuda_graph_max_bs >= 0, ">= 0"),
                  ("--num-threads", self.num_threads, self.num_threads is None or self.num_threads >= 1, ">= 1")]
        for flag, value, ok, rule in checks:
            if not ok:
                raise ValueError(f"{flag} {value!r} is invalid: it must be {rule}")
