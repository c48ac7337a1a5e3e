# Tangled from book/chapters/ch15_server.ipynb — edit the notebook, not this file.
from __future__ import annotations

import argparse
import math
import os
import socket
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, List, NoReturn, Tuple

from minisgl.distributed import DistributedInfo, free_tcp_address
from minisgl.attention import ATTN_BACKENDS
from minisgl.kvcache import PREFIX_CACHES
from minisgl.moe import MOE_BACKENDS
from minisgl.scheduler import SchedulerConfig
from minisgl.utils import pick_device
from minisgl.utils.hf import load_hf_config, resolve_model_path


@dataclass(frozen=True)
class ServerArgs(SchedulerConfig):
    """调度器的配置，加上服务自己的：监听地址、分词进程数、交互模式、API key，以及各进程之间的 ZMQ 地址。"""

    server_host: str = "127.0.0.1"  # --host
    server_port: int = 1919  # --port
    num_tokenizer: int = 0  # --num-tokenizer；0：detokenizer 进程兼做分词
    shell: bool = False  # --shell：不起 HTTP 服务，在终端里对话
    api_key: str | None = None  # --api-key：设了就要求 Authorization: Bearer <key>
    silent_output: bool = False  # 交互模式下工作进程不打 INFO 日志
    zmq_frontend_addr: str = ""  # detokenizer（和调度器的统计）→ API Server
    zmq_tokenizer_addr: str = ""  # API Server → tokenizer；num_tokenizer = 0 时就是 detokenizer 的地址
    nnodes: int = 1  # --nnodes：TP 的 --tp 个 rank 平分在这么多台机器上
    node_rank: int = 0  # --node-rank：本机是第几个节点；只有节点 0 起 API Server
    dist_timeout: float = 60.0  # --dist-timeout：节点之间互相找到的期限（秒）

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.num_tokenizer <= MAX_TOKENIZERS:  # 每个都是一个进程、几个 ZMQ 套接字：几百个就耗尽文件描述符
            raise ValueError(f"--num-tokenizer {self.num_tokenizer} is invalid: it must be in 0..{MAX_TOKENIZERS}")
        if not 0 < self.server_port < 65536:
            raise ValueError(f"--port {self.server_port} is invalid: it must be in 1..65535")
        tp, n = self.tp_info.size, self.nnodes
        if n < 1:
            raise ValueError(f"--nnodes {n} is invalid: it must be >= 1")
        if tp % n:
            raise ValueError(f"--tp {tp} is invalid with --nnodes {n}: --tp is the total over all nodes, "
                             f"so it must be a multiple of --nnodes")
        if not 0 <= self.node_rank < n:
            raise ValueError(f"--node-rank {self.node_rank} is invalid: with --nnodes {n} it must be in 0..{n - 1}")
        if n > 1 and self.dist_init_addr is None:
            raise ValueError(f"--dist-init-addr is required with --nnodes {n}: node 0's HOST:PORT, "
                             f"the same on every node")
        if not (math.isfinite(self.dist_timeout) and self.dist_timeout > 0):  # nan > 0 也是 False，但要说清楚
            raise ValueError(f"--dist-timeout {self.dist_timeout} is invalid: it must be a finite number > 0")

    @property
    def tokenizer_create_addr(self) -> bool:
        """有单独的 tokenizer 进程时，API Server 绑定它们的地址、它们去连；没有时 detokenizer 绑定、API Server 去连。"""
        return self.num_tokenizer > 0

    @property
    def tokenizer_addrs(self) -> List[str]:
        """API Server → 分词进程：每个 tokenizer 一个地址，同一个请求的消息总走同一个（--num-tokenizer 0 时是 detokenizer）。"""
        if self.num_tokenizer == 0:
            return [self.zmq_detokenizer_addr or ""]
        return [f"{self.zmq_tokenizer_addr}-{i}" for i in range(self.num_tokenizer)]

    @property
    def served_model_name(self) -> str:
        return Path(self.model_path).name

    @property
    def dist_host_port(self) -> Tuple[str, int]:
        """--dist-init-addr 的 (HOST, PORT)：PORT 是 torch.distributed 的会合点，PORT+1 启动器之间的连接，PORT+2 广播。"""
        assert self.dist_init_addr is not None
        host, port = self.dist_init_addr.removeprefix("tcp://").rsplit(":", 1)
        return host, int(port)


def model_limits(args: ServerArgs) -> Tuple[int, int]:
    """(上下文长度, 词表大小)。上下文和引擎算的一样（第 8 章）：模型的 max_position_embeddings 和
    --max-seq-len-override 取小的。分词进程和 API Server 用它们在请求进入调度器之前检查。"""
    from minisgl.models import ModelConfig

    mc = ModelConfig.from_hf(load_hf_config(args.model_path))
    limit = mc.max_position_embeddings
    return min(args.max_seq_len_override or limit, limit), mc.vocab_size


MAX_TOKENIZERS = 64  # --num-tokenizer 的上限
MAX_THREADS = 1024  # --num-threads 的上限：每个调度器进程的 torch 线程；几万个就耗尽系统的线程


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # 一行错误，不打印整段 usage
        self.exit(2, f"error: {message}\n")

def _default(name: str) -> Any:
    return {f.name: f.default for f in fields(ServerArgs)}[name]

def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m minisgl", allow_abbrev=False,
                description="minisgl：OpenAI 兼容的推理服务（--shell：在终端里对话）")
    add = p.add_argument
    add("--model", "--model-path", default=None, help="模型目录或 Hugging Face 仓库名（默认：内置的 SmolLM2-135M）")
    add("--dtype", default=_default("dtype"), help="auto / float32 / bfloat16 / float16")
    add("--device", default=_default("device"), help="auto / cpu / cuda")
    add("--tp", "--tp-size", "--tensor-parallel-size", type=int, default=1, help="张量并行的进程数")
    add("--host", default=_default("server_host"))
    add("--port", type=int, default=_default("server_port"))
    add("--num-pages", type=int, default=_default("num_pages"), help="KV 池的页数（默认按内存推算）")
    add("--page-size", type=int, default=_default("page_size"), help="每页几个 token（默认：GPU 上 16，CPU 上 1）")
    add("--max-running-requests", type=int, default=_default("max_running_req"))
    add("--max-seq-len-override", type=int, default=_default("max_seq_len_override"))
    add("--max-prefill-length", "--max-extend-length", type=int, default=_default("max_extend_tokens"))
    add("--attn", "--attention-backend", default=_default("attention_backend"), choices=["auto", *ATTN_BACKENDS.names()],
        help="auto：GPU 上装了 FlashInfer 时是 fi，否则 torch")
    add("--cache", "--cache-type", default=_default("cache_type"), choices=PREFIX_CACHES.names())
    add("--moe-backend", default=_default("moe_backend"), choices=["auto", *MOE_BACKENDS.names()],
        help="MoE 模型的专家计算（第 4 章）。auto：GPU 上装了 Triton 时是 triton，否则 torch")
    add("--cuda-graph-max-bs", "--graph", type=int, default=_default("cuda_graph_max_bs"))
    add("--num-tokenizer", "--tokenizer-count", type=int, default=_default("num_tokenizer"),
        help="单独的分词进程数（0：detokenizer 兼做分词）")
    add("--num-threads", type=int, default=None,
        help="每个调度器进程（TP rank）的 torch CPU 线程数；默认 GPU 上 1，CPU 上是本进程可用的核数 ÷ 本机的 rank 数")
    add("--memory-ratio", type=float, default=None,
        help=f"GPU：权重 + KV 池最多占显存的比例（默认 {_default('memory_ratio')}）；CPU 上不适用，给了就报错")
    add("--cpu-kv-memory-mb", type=int, default=None,
        help=f"CPU：KV 池的大小（MiB，默认 {_default('cpu_kv_memory_mb')}）；GPU 上不适用，给了就报错")
    add("--dummy-weight", action="store_true",
        help="不读权重文件，按模型的配置随机初始化（测速度、测显存用）")
    add("--disable-overlap-scheduling", action="store_true")
    add("--shell", "--shell-mode", action="store_true", help="在终端里对话，不起 HTTP 服务")
    add("--api-key", default=None)
    add("--nnodes", type=int, default=_default("nnodes"), help="节点（机器）数；--tp 是所有节点加起来的 rank 数")
    add("--node-rank", type=int, default=_default("node_rank"), help="本节点的编号，0..nnodes-1")
    add("--dist-init-addr", "--nccl-init-addr", default=None, help="节点 0 的 HOST:PORT，每个节点都给同一个")
    add("--dist-timeout", type=float, default=_default("dist_timeout"), help="节点互相找到的期限（秒）")
    return p

def _zmq_addr(i: int) -> str:
    return f"ipc:///tmp/minisgl_{i}.pid={os.getpid()}"

def _dist_addr(text: str) -> Tuple[str, int]:
    """--dist-init-addr HOST:PORT → (IP, PORT)。主机名在这里解析成 IP：ZMQ 的 bind 只认地址。"""
    host, sep, port = text.rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65534):
        raise ValueError(f"--dist-init-addr {text!r} is invalid: it must be HOST:PORT with PORT in 1..65533 "
                         f"(PORT+1 and PORT+2 are used too), e.g. 192.168.0.2:25000")
    try:
        return socket.gethostbyname(host), int(port)
    except OSError:
        raise ValueError(f"--dist-init-addr {text!r} is invalid: cannot resolve the host {host!r}") from None

def parse_args(argv: List[str], run_shell: bool = False) -> ServerArgs:
    """命令行 → ServerArgs。坏的值打印一行 error: ... 并以 2 退出（和 argparse 自己的错误一样）。"""
    parser = build_parser()
    ns = parser.parse_args(argv)
    shell = ns.shell or run_shell
    try:
        if ns.tp < 1:
            raise ValueError(f"--tp {ns.tp} is invalid: it must be >= 1")
        # --api-key "$KEY"，KEY 没设：空的密钥等于不要密钥，服务悄悄对谁都开着；首尾的空白永远对不上（客户端送来的
        # 会被去掉）
        if ns.api_key is not None and (not ns.api_key.strip() or ns.api_key != ns.api_key.strip()):
            raise ValueError("--api-key is invalid: it must not be empty or start or end with whitespace")
        host, port = _dist_addr(ns.dist_init_addr) if ns.dist_init_addr is not None else ("", 0)
        if ns.num_threads is not None and not 1 <= ns.num_threads <= MAX_THREADS:
            raise ValueError(f"--num-threads {ns.num_threads} is invalid: it must be in 1..{MAX_THREADS}")
        gpu = pick_device(ns.device).type == "cuda"  # 写错的、这台机器上没有的设备：在这里说，不等工作进程
        if ns.memory_ratio is not None or ns.cpu_kv_memory_mb is not None:  # 只在一种设备上有意义：另一种上给了就说
            if ns.memory_ratio is not None and not gpu:
                raise ValueError("--memory-ratio applies on a GPU only: on the CPU the KV pool's size is "
                                 "--cpu-kv-memory-mb (or --num-pages)")
            if ns.cpu_kv_memory_mb is not None and gpu:
                raise ValueError("--cpu-kv-memory-mb applies on the CPU only: on a GPU the KV pool's size is "
                                 "--memory-ratio (or --num-pages)")
        model_path = resolve_model_path(ns.model)
        try:
            load_hf_config(model_path)  # config.json 读不了（不是 JSON、缺字段）：在这里说，不等工作进程
        except (ValueError, OSError):
            raise
        except Exception as e:  # transformers 的校验（比如层数和 layer_types 的长度对不上）抛的不都是 ValueError
            raise ValueError(f"--model {model_path}: its config.json is invalid: {e}") from None
        if not ns.dummy_weight and not any(Path(model_path).glob("*.safetensors")):
            raise ValueError(f"--model {model_path} has no *.safetensors weights (--dummy-weight starts with "
                             f"random weights from its config)")
        detokenizer = _zmq_addr(1)
        return ServerArgs(
            model_path=model_path, tp_info=DistributedInfo(0, ns.tp), dtype=ns.dtype, device=ns.device,
            page_size=ns.page_size, num_pages=ns.num_pages,
            memory_ratio=_default("memory_ratio") if ns.memory_ratio is None else ns.memory_ratio,
            cpu_kv_memory_mb=_default("cpu_kv_memory_mb") if ns.cpu_kv_memory_mb is None else ns.cpu_kv_memory_mb,
            num_threads=ns.num_threads, use_dummy_weight=ns.dummy_weight,
            max_running_req=1 if shell else ns.max_running_requests,  # 交互模式只有一个用户
            max_seq_len_override=ns.max_seq_len_override, attention_backend=ns.attn, moe_backend=ns.moe_backend,
            cuda_graph_max_bs=min(ns.cuda_graph_max_bs, 1) if shell else ns.cuda_graph_max_bs,
            dist_init_addr=f"tcp://{host}:{port}" if host else free_tcp_address() if ns.tp > 1 and ns.nnodes == 1 else None,
            max_extend_tokens=ns.max_prefill_length, cache_type=ns.cache,
            enable_overlap=not ns.disable_overlap_scheduling,
            zmq_backend_addr=_zmq_addr(0), zmq_detokenizer_addr=detokenizer,
            zmq_broadcast_addr=f"tcp://{host}:{port + 2}" if ns.nnodes > 1 else _zmq_addr(4) if ns.tp > 1 else None,
            server_host=ns.host, server_port=ns.port, num_tokenizer=ns.num_tokenizer, shell=shell,
            api_key=ns.api_key, silent_output=shell, zmq_frontend_addr=_zmq_addr(2),
            zmq_tokenizer_addr=_zmq_addr(3) if ns.num_tokenizer > 0 else detokenizer,
            nnodes=ns.nnodes, node_rank=ns.node_rank, dist_timeout=ns.dist_timeout)
    except (ValueError, OSError) as e:  # OSError：读不了的模型目录、config.json（FileNotFoundError 也是）
        parser.error(str(e))
