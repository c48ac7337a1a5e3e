# Tangled from book/chapters/ch08_engine.ipynb — edit the notebook, not this file.
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List

import torch

from minisgl.core import Batch, Req
from minisgl.utils import init_logger

if TYPE_CHECKING:
    from .engine import Engine

logger = init_logger(__name__)


def graph_batch_sizes(max_bs: int) -> List[int]:
    """录哪些批大小：1、2、4，然后 8 的倍数，直到 max_bs。"""
    return [bs for bs in (1, 2, 4) if bs <= max_bs] + list(range(8, max_bs + 1, 8))


class GraphRunner:
    """为若干批大小各录一张 decode 的 CUDA Graph；回放前把批补齐到录过的大小。CPU 上什么都不录。"""

    def __init__(self, engine: Engine, max_bs: int) -> None:
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        max_bs = min(max_bs, engine.config.max_running_req)
        reason = self._why_not(engine, max_bs)
        if reason:
            if engine.device.type == "cuda":
                logger.info_rank0(f"CUDA graphs off: {reason}")
            self.batch_sizes: List[int] = []
            return
        self.batch_sizes = graph_batch_sizes(max_bs)
        self.max_bs = self.batch_sizes[-1]
        self._dummy = Req(torch.zeros(1, dtype=torch.int32), table_idx=engine.page_table.shape[0] - 1,
                          cached_len=0, output_len=1, uid=-1)  # 页表最后一行：所有位置都指向备用页
        self._capture(engine)  # 不留 engine 的引用：引擎持有本对象，反过来再持有会成环，del 引擎时显存不会马上还

    @staticmethod
    def _why_not(engine: Engine, max_bs: int) -> str:
        if engine.device.type != "cuda":
            return "not a CUDA device"
        if max_bs == 0:
            return "--cuda-graph-max-bs 0"
        if not engine.ctx.attn_backend.supports_cuda_graph:
            return f"the attention backend {type(engine.ctx.attn_backend).__name__} cannot be captured"
        moe = engine.ctx.moe_backend
        if moe is not None and not moe.supports_cuda_graph:
            return f"the MoE backend {type(moe).__name__} cannot be captured"
        return ""

    def can_use(self, batch: Batch) -> bool:
        return bool(self.batch_sizes) and batch.is_decode and batch.size <= self.max_bs

    def pad(self, batch: Batch) -> None:
        padded = next(bs for bs in self.batch_sizes if bs >= batch.size)
        batch.padded_reqs = batch.reqs + [self._dummy] * (padded - batch.size)

    def _capture(self, engine: Engine) -> None:
        max_bs = self.max_bs
        dev = engine.device
        engine.ctx.attn_backend.init_capture_graph(max_bs, engine.page_table.shape[1])
        self.input_ids = torch.zeros(max_bs, dtype=torch.int32, device=dev)
        self.positions = torch.zeros(max_bs, dtype=torch.int32, device=dev)
        self.out_loc = torch.full((max_bs,), engine.dummy_slot, dtype=torch.int32, device=dev)
        self.logits = torch.empty(max_bs, engine.model_config.vocab_size, dtype=engine.dtype, device=dev)
        pool = torch.cuda.graph_pool_handle()  # 所有图共用一个内存池：大的先录，小的复用它的内存
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            for bs in reversed(self.batch_sizes):
                batch = self._static_batch(bs)
                engine.ctx.attn_backend.prepare_for_graph(batch)
                with engine.ctx.forward_batch(batch):
                    engine.model.forward(batch.input_ids, batch.positions)  # 先跑一遍：懒初始化不能录进图里
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=stream):
                        self.logits[:bs] = engine.model.forward(batch.input_ids, batch.positions)
                self.graphs[bs] = graph
        torch.cuda.current_stream(dev).wait_stream(stream)
        logger.info_rank0(f"CUDA graphs captured for batch sizes {self.batch_sizes[0]}..{max_bs} "
                          f"({len(self.batch_sizes)} graphs)")

    def _static_batch(self, bs: int) -> Batch:
        batch = Batch([self._dummy] * bs, "decode")
        batch.input_ids, batch.positions, batch.out_loc = self.input_ids[:bs], self.positions[:bs], self.out_loc[:bs]
        return batch

    def replay(self, batch: Batch) -> torch.Tensor:
        """batch 已经 pad 过、prepare 过、prepare_for_graph 过。返回 [padded B, V] 的 logits（静态缓冲区的视图）。"""
        bs = batch.padded_size
        self.input_ids[:bs].copy_(batch.input_ids)
        self.positions[:bs].copy_(batch.positions)
        self.out_loc[:bs].copy_(batch.out_loc)
        self.graphs[bs].replay()
        return self.logits[:bs]
