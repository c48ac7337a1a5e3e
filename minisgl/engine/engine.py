# Tangled from book/chapters/ch08_engine.ipynb and ch17_structured.ipynb — edit the notebooks, not this file.
from __future__ import annotations

import os
from typing import NamedTuple

import psutil
import torch

from minisgl.attention import create_attention_backend
from minisgl.core import Batch, Context, current_ctx, set_global_ctx, use_ctx
from minisgl.distributed import get_tp_info, init_distributed, kv_head_range, set_tp_info
from minisgl.kvcache import MHAKVCache
from minisgl.layers import BaseOP
from minisgl.layers.base import linear, onednn_weight
from minisgl.models import ModelConfig, create_model, init_dummy_weight, load_weight
from minisgl.moe import create_moe_backend, resolve_moe_backend
from minisgl.utils import align_ceil, div_ceil, init_logger, parse_dtype, pick_device, set_num_threads, torch_dtype
from minisgl.utils.hf import load_hf_config

from .config import EngineConfig
from .graph import GraphRunner
from .sample import BatchSamplingArgs, LogprobsOutput, Sampler

logger = init_logger(__name__)


class ForwardOutput(NamedTuple):
    next_tokens_gpu: torch.Tensor  # [B] int32，在设备上（第 11 章的重叠调度直接用它）
    next_tokens_cpu: torch.Tensor  # [B] int32，CPU；GPU 上要等 copy_done_event 之后才能读
    copy_done_event: torch.cuda.Event | None  # CPU 上是 None：拷贝是同步的
    logprobs: LogprobsOutput | None = None  # 在 CPU 上，和 next_tokens_cpu 同一个 event；没有请求要时是 None


class Engine:
    """一个 TP rank 上的模型执行者：建模型、定 KV 池、建 Context；prepare_batch + forward_batch 跑一步
    （forward_batch = forward + sample，附录的结构化输出在两者之间填掩码）。"""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        tp = config.tp_info
        set_tp_info(tp.rank, tp.size)
        self.device = _pick_device(config.device, tp.rank)
        # CPU：这个 rank 分到的核（第 1 章）；GPU：CPU 只拼小张量，一个线程（OMP_NUM_THREADS 或 num_threads 仍可覆盖）
        gpu_default = 1 if self.device.type == "cuda" and "OMP_NUM_THREADS" not in os.environ else None
        self.num_threads = set_num_threads(config.num_threads or gpu_default, share=tp.size)
        self.dtype = (torch.bfloat16 if self.device.type == "cuda" else torch.float32) if config.dtype == "auto" \
            else parse_dtype(config.dtype)
        if tp.size > 1:
            if config.dist_init_addr is None:
                raise ValueError(f"--tp {tp.size} needs a rendezvous address (dist_init_addr) for the ranks")
            init_distributed(tp, self.device, config.dist_init_addr)
        self.model_config = ModelConfig.from_hf(load_hf_config(config.model_path))
        with torch.device(self.device), torch_dtype(self.dtype):
            self.model = create_model(self.model_config)
        if config.use_dummy_weight:
            init_dummy_weight(self.model)
        else:
            load_weight(self.model, config.model_path)
        onednn = self.device.type == "cpu" and self.dtype == torch.float32 and config.cpu_onednn
        self.matmul = "onednn" if onednn and _use_onednn(self.model) else "torch"  # 第 8 章"CPU 上的矩阵乘"

        mc = self.model_config
        limit = mc.max_position_embeddings
        self.max_seq_len = min(config.max_seq_len_override or limit, limit)
        kv_start, kv_end = kv_head_range(mc.num_kv_heads, get_tp_info())
        self.num_pages = self._determine_num_pages(kv_end - kv_start)
        # 多分配一页给 CUDA Graph 补齐用的假请求：它们的 K/V 写进这一页，不会碰到真请求的槽
        self.kv_cache = MHAKVCache(mc.num_layers, self.num_pages + 1, config.page_size, kv_end - kv_start,
                                   mc.head_dim, self.dtype, self.device)
        self.dummy_slot = self.num_pages * config.page_size
        rows, cols = config.max_running_req + 1, align_ceil(self.max_seq_len, config.page_size)  # 最后一行留给假请求
        if rows * cols * 4 > (total := _memory(self.device)):  # 一个写错的数：否则是分配器在工作进程里的 traceback
            raise ValueError(f"--max-running-requests {config.max_running_req} needs a page table of "
                             f"{rows * cols * 4 / 2**30:.1f} GiB (a row of max_seq_len {self.max_seq_len} for each "
                             f"request), more than the {total / 2**30:.1f} GiB of memory here; give it fewer")
        self.page_table = torch.zeros(rows, cols, dtype=torch.int32, device=self.device)
        self.page_table[-1].fill_(self.dummy_slot)
        attn = _resolve_attention(config.attention_backend, self.device)
        attn_backend = create_attention_backend(attn, self.kv_cache, self.page_table,
                                                mc.num_qo_heads // tp.size)
        moe = resolve_moe_backend(config.moe_backend, self.device) if mc.is_moe else None  # auto：GPU 上 triton
        moe_backend = create_moe_backend(moe) if moe else None
        self.ctx = Context(config.page_size, self.page_table, self.kv_cache, attn_backend, moe_backend)
        set_global_ctx(self.ctx)
        self.sampler = Sampler(self.device, mc.vocab_size, self._random_seed(), dtype=self.dtype)
        self.graph_runner = GraphRunner(self, config.cuda_graph_max_bs)
        logger.info_rank0(f"engine: {mc.architecture} {self.dtype} on {self.device}, attention {attn}"
                          f"{f', moe {moe}' if moe else ''}, {self.num_threads} CPU thread(s), KV pool {self.num_pages} pages x {config.page_size} tokens "
                          f"({self.kv_cache.nbytes / 2**20:.0f} MiB), max_seq_len {self.max_seq_len}")

    def prepare_batch(self, batch: Batch, token_pool: torch.Tensor | None = None) -> None:
        """补齐（能用 CUDA Graph 时）、把输入拷到设备上、准备注意力的元数据。token_pool 见 Batch.prepare。"""
        if self.graph_runner.can_use(batch):
            self.graph_runner.pad(batch)
            batch.prepare(self.page_table, token_pool)
            self.ctx.attn_backend.prepare_for_graph(batch)
        else:
            batch.prepare(self.page_table, token_pool)
            self.ctx.attn_backend.prepare_metadata(batch)

    def forward_batch(self, batch: Batch, args: BatchSamplingArgs) -> ForwardOutput:
        """前向一批、采样；每个请求 complete_one()。返回的 token 在 GPU 上是异步拷回 CPU 的。"""
        return self.sample(self.forward(batch), args)

    def forward(self, batch: Batch) -> torch.Tensor:
        """只提交前向（GPU 上立刻返回），每个请求 complete_one()。返回 [B, V] 的 logits：CUDA Graph 的静态缓冲区
        的视图，在下一次前向之前采样（附录：结构化输出在这两步之间填掩码）。"""
        with use_ctx(self.ctx), self.ctx.forward_batch(batch):  # 装上自己的 Context：进程里可以有几个引擎
            if self.graph_runner.can_use(batch):
                logits = self.graph_runner.replay(batch)  # [padded B, V]
            else:
                logits = self.model.forward(batch.input_ids, batch.positions)  # [B, V]
        for req in batch.reqs:
            req.complete_one()
        return logits[:batch.size]  # [B, V]

    def sample(self, logits: torch.Tensor, args: BatchSamplingArgs) -> ForwardOutput:
        """logits [B, V] → 下一个 token（和 logprobs），异步拷回 CPU。"""
        next_tokens = self.sampler.sample(logits, args)  # [B] int32
        logprobs = self.sampler.logprobs(logits, next_tokens, args)  # 没有请求要时是 None
        if self.device.type != "cuda":
            return ForwardOutput(next_tokens, next_tokens, None, logprobs)
        host = _to_host(next_tokens)
        if logprobs is not None:
            logprobs = LogprobsOutput(*(_to_host(t) for t in logprobs))
        event = torch.cuda.Event()
        event.record()  # 排在所有拷贝之后：它完成时，token 和 logprobs 都在 CPU 上了
        return ForwardOutput(next_tokens, host, event, logprobs)

    def shutdown(self) -> None:
        if current_ctx() is self.ctx:  # 同一个进程里可以有几个引擎：只摘下自己的
            set_global_ctx(None)
        if get_tp_info().size > 1:
            torch.distributed.destroy_process_group()

    def _determine_num_pages(self, local_kv_heads: int) -> int:
        cfg, mc = self.config, self.model_config
        page_bytes = 2 * mc.num_layers * local_kv_heads * mc.head_dim * cfg.page_size * self.dtype.itemsize
        if cfg.num_pages is not None:
            num_pages, source = cfg.num_pages, f"--num-pages {cfg.num_pages}"
        elif self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            budget = free - (1 - cfg.memory_ratio) * total  # 留出 (1 - ratio) 给激活和 CUDA Graph
            num_pages, source = max(int(budget // page_bytes), 0), f"--memory-ratio {cfg.memory_ratio}"
        else:
            num_pages = cfg.cpu_kv_memory_mb * 2**20 // page_bytes
            source = f"--cpu-kv-memory-mb {cfg.cpu_kv_memory_mb}"
        if get_tp_info().size > 1:  # 各 rank 的页数必须一样（各卡的空闲显存、各节点的参数可以不同）：取最小
            n = torch.tensor([num_pages], device=self.device)
            torch.distributed.all_reduce(n, op=torch.distributed.ReduceOp.MIN)
            num_pages = int(n)
        total = _memory(self.device)
        if num_pages * page_bytes > total:  # 一个写错的数：否则是分配器在工作进程里的一段 traceback
            raise ValueError(f"the KV pool from {source} needs {num_pages * page_bytes / 2**30:.1f} GiB, more than "
                             f"this {'GPU' if self.device.type == 'cuda' else 'machine'}'s {total / 2**30:.1f} GiB "
                             f"of memory; give it less")
        need = div_ceil(self.max_seq_len, cfg.page_size)
        if num_pages < need:
            raise ValueError(f"the KV pool from {source} holds {num_pages} pages of {cfg.page_size} tokens "
                             f"({num_pages * cfg.page_size} tokens), fewer than one request of max_seq_len "
                             f"{self.max_seq_len}; give it more memory or lower --max-seq-len-override")
        return num_pages

    def _random_seed(self) -> int:
        """没给 seed 的请求用它派生随机数；TP 下由 rank 0 定，广播给所有 rank。"""
        seed = self.config.random_seed
        if seed is None:
            seed = int.from_bytes(os.urandom(7), "little")
        if get_tp_info().size > 1:
            t = torch.tensor([seed], dtype=torch.int64, device=self.device)
            torch.distributed.broadcast(t, src=0)
            seed = int(t)
        return seed


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """设备上的张量异步拷进一块 pinned 内存；要等之后记录的 event 完成才能读。"""
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


def _memory(device: torch.device) -> int:
    """这块 GPU（或这台机器）一共有多少字节的内存：写错的数要分配的比这还多时，说清楚，不让分配器在半路出错。"""
    return torch.cuda.mem_get_info(device)[1] if device.type == "cuda" else psutil.virtual_memory().total


def _pick_device(name: str, rank: int) -> torch.device:
    device = pick_device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", rank)  # 第 rank 个 GPU
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def _resolve_attention(name: str, device: torch.device) -> str:
    if name != "auto":
        return name
    if device.type == "cuda":
        try:
            import flashinfer  # noqa: F401

            return "fi"
        except ImportError:
            logger.warning("flashinfer is not installed: attention falls back to the torch backend")
    return "torch"


def _onednn_works() -> bool:
    """先在一个小矩阵上试一次：这个平台的 oneDNN 排得了、算得对，才把模型换过去。"""
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(24, 16, generator=g), torch.randn(3, 16, generator=g)
    try:
        return torch.allclose(linear(x, onednn_weight(w)), torch.nn.functional.linear(x, w), rtol=1e-4, atol=1e-4)
    except (RuntimeError, NotImplementedError) as e:
        logger.warning(f"oneDNN does not work here ({e}); matmuls use F.linear")
        return False


ONEDNN_CACHE_CAPACITY = 64  # 用户没设时，oneDNN 的两个 kernel 缓存各存这么多项（见 _use_onednn）


def _use_onednn(model: BaseOP) -> bool:
    """每个做矩阵乘的算子（有 use_onednn 方法的：线性层、LM head）把权重换成 oneDNN 预先排好的格式。
    这个 torch 没有带 oneDNN、或者小矩阵上试算不过时什么都不换，返回 False，矩阵乘照旧走 F.linear。"""
    if not torch.backends.mkldnn.is_available():
        return False
    # oneDNN 为每个（权重形状, 行数）建一个 kernel 缓存起来，两个缓存默认各 1024 项。服务里每个新的提示词长度、批大小
    # 都是新的行数，缓存满了以后不停地换进换出，调度器的内存跟着一直涨。第一次用 oneDNN 之前把它们限小（用户设了就听用户的）
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(name, str(ONEDNN_CACHE_CAPACITY))
    if not _onednn_works():
        return False
    ops = [model]
    while ops:
        op = ops.pop()
        ops.extend(child for _, child in op.children() if isinstance(child, BaseOP))
        if hasattr(op, "use_onednn"):
            op.use_onednn()
    return True
