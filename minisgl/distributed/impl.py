# Tangled from book/chapters/ch05_tensor_parallel.ipynb — edit the notebook, not this file.
from __future__ import annotations

import socket
from datetime import timedelta
from typing import List, Tuple

import torch
import torch.distributed as dist

from .info import DistributedInfo, get_tp_info


def free_tcp_address(host: str = "127.0.0.1") -> str:
    """向操作系统要一个空闲端口，拼成 init_distributed 的地址；由启动方选好，再传给所有 rank。"""
    with socket.socket() as s:
        s.bind((host, 0))
        return f"tcp://{host}:{s.getsockname()[1]}"


def init_distributed(tp_info: DistributedInfo, device: torch.device, addr: str,
                     timeout_s: float = 60.0) -> None:
    """建立 TP 进程组：CPU 上用 gloo，CUDA 上用 NCCL。所有 rank 传同一个 addr；等所有 rank 都到齐才返回。"""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL 的通信绑定在当前 GPU 上
    dist.init_process_group(backend=backend, init_method=addr, rank=tp_info.rank, world_size=tp_info.size,
                            timeout=timedelta(seconds=timeout_s),
                            device_id=device if device.type == "cuda" else None)


def destroy_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """原地把所有 rank 的 x 求和，返回 x。TP=1 时什么都不做。"""
    if get_tp_info().size > 1:
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def all_gather(x: torch.Tensor) -> torch.Tensor:
    """把所有 rank 的 x 沿最后一维按 rank 顺序拼起来：[..., D] → [..., size*D]。TP=1 时原样返回。"""
    size = get_tp_info().size
    if size == 1:
        return x
    parts: List[torch.Tensor] = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


def shard_range(n: int, tp_info: DistributedInfo, what: str) -> Tuple[int, int]:
    """长度 n 平均切成 tp 份，本 rank 的 [start, end)；除不尽时报 ValueError（what 是维度的名字）。"""
    if n % tp_info.size:
        raise ValueError(f"--tp {tp_info.size} must divide {what}={n}")
    per = n // tp_info.size
    return tp_info.rank * per, (tp_info.rank + 1) * per


def kv_head_range(num_kv_heads: int, tp_info: DistributedInfo) -> Tuple[int, int]:
    """本 rank 放哪几个 KV 头。TP 大于头数时每个 rank 放 1 个，tp/头数 个 rank 共用（复制）同一个头。"""
    tp = tp_info.size
    if tp <= num_kv_heads:
        return shard_range(num_kv_heads, tp_info, "num_key_value_heads")
    if tp % num_kv_heads:
        raise ValueError(f"--tp {tp} is larger than num_key_value_heads={num_kv_heads}, so it must be a "
                         f"multiple of it (each KV head is then replicated on {tp}/{num_kv_heads} ranks)")
    head = tp_info.rank * num_kv_heads // tp
    return head, head + 1


def vocab_range(vocab_size: int, tp_info: DistributedInfo) -> Tuple[int, int]:
    """词表切分：每个 rank ceil(V/tp) 行（靠后的 rank 可能不满，甚至为空），本 rank 拥有的 token id [start, end)。"""
    per = -(-vocab_size // tp_info.size)
    start = min(tp_info.rank * per, vocab_size)
    return start, min(start + per, vocab_size)
