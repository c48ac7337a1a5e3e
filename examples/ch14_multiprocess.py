# Tangled from book/chapters/ch14_multiprocess.ipynb — edit the notebook, not this file.
"""第 14 章：调度器在自己的进程里。一个 tokenizer 进程 + 调度器进程（TP=1，再 TP=2 两个进程），经 ZMQ 收发文字。"""

import multiprocessing as mp
import shutil
import tempfile
import time
from pathlib import Path
from typing import Dict

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.utils import logging as hf_logging

from minisgl.core import SamplingParams
from minisgl.distributed import DistributedInfo
from minisgl.message import AbortMsg, BatchFrontendMsg, ExitMsg, TokenizeMsg
from minisgl.scheduler import SchedulerConfig, start_scheduler_processes
from minisgl.tokenizer import tokenize_worker
from minisgl.utils.hf import qwen3_tokenizer_dir
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue

PROMPTS = ["你好，", "The capital of France is", "1, 2, 3,", "一个很长的故事："]


def tiny_qwen3(path: Path) -> Path:
    """随机权重的小 Qwen3（2 层、4 个头、2 个 KV 头：TP=2 能切），配真实的 Qwen3 分词器。"""
    hf_logging.disable_progress_bar()
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, initializer_range=0.5)
    Qwen3ForCausalLM(config).save_pretrained(path)
    for f in qwen3_tokenizer_dir().iterdir():
        shutil.copy(f, path / f.name)
    return path


def serve(model: Path, tp: int, workdir: str) -> Dict[int, str]:
    addr = {n: f"ipc://{workdir}/tp{tp}-{n}" for n in ("backend", "detok", "frontend", "bcast")}
    config = SchedulerConfig(model, tp_info=DistributedInfo(0, tp), device="cpu", num_pages=2048,
                             max_seq_len_override=512, zmq_backend_addr=addr["backend"],
                             zmq_detokenizer_addr=addr["detok"], zmq_broadcast_addr=addr["bcast"])
    frontend: ZmqPullQueue = ZmqPullQueue(addr["frontend"], create=True)  # 我们扮演 API Server
    ack = mp.get_context("spawn").Queue()
    t0 = time.perf_counter()
    schedulers = start_scheduler_processes(config, ack)
    detok = mp.get_context("spawn").Process(
        target=tokenize_worker, name="minisgl-detokenizer",
        kwargs=dict(tokenizer_path=str(model), addr=addr["detok"], create=True, backend_addr=addr["backend"],
                    frontend_addr=addr["frontend"], ack_queue=ack))
    detok.start()
    for _ in range(2):  # rank 0 的调度器 + detokenizer（它也分词：--num-tokenizer 0）
        print("  ", ack.get(timeout=300))
    print(f"  TP={tp}: {len(schedulers)} 个调度器进程 + 1 个分词进程，{time.perf_counter() - t0:.1f}s 后就绪")
    api: ZmqPushQueue = ZmqPushQueue(addr["detok"], create=False)
    t0 = time.perf_counter()
    for uid, text in enumerate(PROMPTS):
        max_tokens = 200 if uid == 3 else 12
        api.put(TokenizeMsg(uid, text, SamplingParams(max_tokens=max_tokens, ignore_eos=True)))
    texts: Dict[int, str] = {uid: "" for uid in range(len(PROMPTS))}
    reasons: Dict[int, str] = {}
    while len(reasons) < len(PROMPTS):
        msg = frontend.get(timeout=60)
        for r in msg.data if isinstance(msg, BatchFrontendMsg) else [msg]:
            if r.uid in reasons:  # 已经中止：路上还有的回复丢掉
                continue
            texts[r.uid] += r.incremental_output
            if r.finished:
                reasons[r.uid] = f"{r.finish_reason}，{r.completion_tokens} 个 token"
            elif r.uid == 3:  # 3 号收到第一段文字，客户端就走了：中止它
                api.put(AbortMsg(uid=3))
                reasons[3] = "中止"
    print(f"  {len(PROMPTS)} 个请求 {time.perf_counter() - t0:.2f}s")
    for uid in sorted(texts):
        print(f"  {uid} {PROMPTS[uid]!r} → {texts[uid][:24]!r}…（{reasons[uid]}）")
    exit_queue: ZmqPushQueue = ZmqPushQueue(addr["backend"], create=False)
    exit_queue.put(ExitMsg())  # 直接告诉调度器：退出（它和分词进程往同一个地址 PUSH）
    for p in schedulers:
        p.join(60)
    print("  调度器进程的退出码:", [p.exitcode for p in schedulers])
    detok.terminate()
    detok.join()
    for q in (api, frontend, exit_queue):
        q.stop()
    return texts


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_qwen3(Path(tmp) / "tiny-qwen3")
        out = {tp: serve(model, tp, tmp) for tp in (1, 2)}
    same = {uid: out[1][uid] == out[2][uid] for uid in range(3)}
    print("TP=1 与 TP=2 的输出逐字相同（0–2 号）:", same)
    if not all(same.values()):
        raise SystemExit("TP=2 must give the same text as TP=1")
