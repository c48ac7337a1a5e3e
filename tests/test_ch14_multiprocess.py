# Tangled from book/chapters/ch14_multiprocess.ipynb — edit the notebook, not this file.
"""第 14 章：调度器进程经 ZMQ 收发；TP=2 的两个进程与 TP=1 逐 token 相同，各 rank 收到的消息序列相同。"""
from __future__ import annotations

import multiprocessing as mp
import tempfile
from typing import Dict, List

import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.distributed import DistributedInfo
from minisgl.llm import LLM
from minisgl.message import AbortBackendMsg, BatchBackendMsg, BatchTokenizerMsg, DetokenizeMsg, ExitMsg, UserMsg
from minisgl.scheduler import SchedulerConfig, run_scheduler_process, start_scheduler_processes
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue

PROMPTS = [[100 + 7 * i + j for j in range(3 + 4 * i)] for i in range(5)]  # 5 个长短不一的提示词
SMALL = dict(device="cpu", num_pages=1024, max_seq_len_override=256)  # 离线 LLM 和调度器进程共用的小配置


class Harness:
    """测试扮演 tokenizer（往调度器 PUSH UserMsg）和 detokenizer（PULL 调度器的结果）。"""

    def __init__(self, model, tp: int, **config) -> None:
        d = tempfile.mkdtemp(prefix="ch14")
        config = {**SMALL, "page_size": 4, "max_running_req": 8, **config}  # GPU 的测试换掉 device 等几项
        self.config = SchedulerConfig(model, tp_info=DistributedInfo(0, tp), zmq_backend_addr=f"ipc://{d}/backend",
                                      zmq_detokenizer_addr=f"ipc://{d}/detok", zmq_broadcast_addr=f"ipc://{d}/bcast",
                                      **config)
        self.detok: ZmqPullQueue = ZmqPullQueue(self.config.zmq_detokenizer_addr, create=True)
        self.send: ZmqPushQueue = ZmqPushQueue(self.config.zmq_backend_addr, create=False)
        self.ack = mp.get_context("spawn").Queue()
        self.procs = start_scheduler_processes(self.config, self.ack, target=_rank_main)
        self.tokens: Dict[int, List[int]] = {}
        self.done: Dict[int, str] = {}
        self.closed = False

    def user(self, uid: int, prompt: List[int], max_tokens: int) -> None:
        self.send.put(self._request(uid, prompt, max_tokens))

    def users(self, prompts: List[List[int]], max_tokens: int) -> None:
        """请求 0..n-1 放进一条 BatchBackendMsg：调度器一次收到全部，批怎么组成不随消息到达的先后变。"""
        self.send.put(BatchBackendMsg([self._request(uid, p, max_tokens) for uid, p in enumerate(prompts)]))

    def _request(self, uid: int, prompt: List[int], max_tokens: int) -> UserMsg:
        self.tokens[uid] = []
        return UserMsg(uid, torch.tensor(prompt, dtype=torch.int32), SamplingParams(max_tokens=max_tokens, ignore_eos=True))

    def collect(self) -> List[DetokenizeMsg]:
        msg = self.detok.get(timeout=60)
        assert isinstance(msg, BatchTokenizerMsg), "one BatchTokenizerMsg per send_result"
        for r in msg.data:
            assert r.uid not in self.done, f"request {r.uid}: a reply after it finished"
            if r.next_token >= 0:
                self.tokens[r.uid].append(r.next_token)
            if r.finished:
                self.done[r.uid] = r.finish_reason
        return msg.data

    def wait(self, uids) -> None:
        while not set(uids) <= set(self.done):
            self.collect()

    def exit(self) -> List[tuple]:
        """ExitMsg：每个进程正常退出（退出码 0），报告它收到了几条消息、消息序列的摘要。"""
        self.send.put(ExitMsg())
        reports = sorted(self.ack.get(timeout=60) for _ in self.procs)
        for p in self.procs:
            p.join(60)
            assert p.exitcode == 0, f"{p.name} exited with {p.exitcode}"
        self.close()
        return reports

    def close(self) -> None:
        """测试失败时也要调用：留下活着的子进程，pytest 退出时会一直等它们。"""
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(30)
        if not self.closed:
            self.send.stop()
            self.detok.stop()
            self.closed = True


@pytest.fixture
def start(tiny_qwen3):
    """start(tp[, model, **config]) 起一组调度器进程；测试结束时（不论成败）收拾干净。"""
    made: List[Harness] = []

    def make(tp: int, model=None, **config) -> Harness:
        made.append(Harness(model or tiny_qwen3, tp, **config))
        assert made[-1].ack.get(timeout=120) == "Scheduler is ready"
        return made[-1]

    yield make
    for h in made:
        h.close()


def _rank_main(config: SchedulerConfig, ack) -> None:
    """spawn 的入口（按名字导入本模块）：跑 run_scheduler_process，退出后报告收到的消息和录了图的批大小（没录时是空的）。"""
    s = run_scheduler_process(config, ack)
    ack.put((config.tp_info.rank, s.num_received, s.message_digest, tuple(s.engine.graph_runner.batch_sizes)))


def reference(model, prompts, max_tokens: int, **config) -> List[List[int]]:
    """离线 LLM（本进程、TP=1）生成的 token：要比的答案。"""
    llm = LLM(model, **{**SMALL, **config})
    try:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        return [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    finally:
        llm.shutdown()


def test_tp2_equals_tp1_and_ranks_see_the_same_messages(tiny_qwen3, start) -> None:
    """TP=2（两个进程，gloo）：请求陆续到达、有的中途中止；tokens 与 TP=1 相同，两个 rank 收到的消息序列相同。"""
    want = reference(tiny_qwen3, PROMPTS, 16)
    h = start(2)
    h.user(0, PROMPTS[0], 16)
    h.user(1, PROMPTS[1], 16)
    h.collect()  # 前两个已经在生成：后面的请求在它们运行中途到达
    for uid in range(2, len(PROMPTS)):
        h.user(uid, PROMPTS[uid], 16)
    h.user(9, PROMPTS[4], 100)
    h.send.put(AbortBackendMsg(9))
    h.wait(list(range(len(PROMPTS))) + [9])
    assert [h.tokens[u] for u in range(len(PROMPTS))] == want
    assert h.done[9] == "abort"
    reports = h.exit()
    assert [r[0] for r in reports] == [0, 1]
    assert reports[0][1:] == reports[1][1:], f"the ranks saw different messages: {reports}"
    assert reports[0][1] == len(PROMPTS) + 3  # 6 个请求、1 个中止、ExitMsg


def test_one_process_tokens_abort_exit(tiny_qwen3, start) -> None:
    """TP=1：经 ZMQ 来的请求与离线 LLM 逐 token 相同；生成中途的中止以 abort 结束；ExitMsg 让进程退出。"""
    want = reference(tiny_qwen3, PROMPTS, 12)
    h = start(1)
    for uid, p in enumerate(PROMPTS):
        h.user(uid, p, 12)
    h.wait(range(len(PROMPTS)))
    assert [h.tokens[u] for u in range(len(PROMPTS))] == want
    assert set(h.done.values()) == {"length"}
    h.user(10, PROMPTS[0], 200)  # 长请求：收到第一个 token 后中止它
    while not h.tokens[10]:
        h.collect()
    h.send.put(BatchBackendMsg([AbortBackendMsg(10), AbortBackendMsg(10)]))  # 重复的中止也只结束一次
    h.wait([10])
    assert h.done[10] == "abort" and 0 < len(h.tokens[10]) < 200
    h.user(11, PROMPTS[1], 12)  # 中止之后照常服务
    h.wait([11])
    assert h.tokens[11] == want[1]
    (rank, n, _, graphs), = h.exit()
    assert (rank, n, graphs) == (0, len(PROMPTS) + 4, ())  # 7 个请求、1 条（成批的）中止、ExitMsg；CPU 上不录图


@pytest.mark.gpu
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("fixture", ["tiny_qwen3", "tiny_qwen3_moe"])
def test_gpu_scheduler_processes_equal_offline(fixture: str, tp: int, start, request) -> None:
    """GPU 上的调度器进程（TP=1，或 TP=2 经 NCCL）与本进程里的离线 LLM（TP=1）逐 token 相同；各 rank 收到的消息相同。"""
    if torch.cuda.device_count() < tp:
        pytest.skip(f"needs {tp} GPUs")
    path = request.getfixturevalue(fixture)
    gpu = dict(device="cuda", dtype="float32", attention_backend="torch", page_size=16)
    want = reference(path, PROMPTS, 24, **gpu)
    assert len({t for ts in want for t in ts}) > 8, "the oracle repeats a few tokens: this test would catch little"
    h = start(tp, path, **gpu)
    for uid, p in enumerate(PROMPTS):
        h.user(uid, p, 24)
    h.wait(range(len(PROMPTS)))
    assert [h.tokens[u] for u in range(len(PROMPTS))] == want
    reports = h.exit()
    assert [r[0] for r in reports] == list(range(tp)) and len({r[1:] for r in reports}) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("fixture", ["tiny_qwen3", "tiny_qwen3_moe"])
def test_gpu_tp2_graphs_equal_eager(fixture: str, start, request) -> None:
    """两块 GPU、bf16、fi：all-reduce 录进 CUDA Graph 的 TP=2 与不录图的 TP=2 逐 token 相同；图真的录了。"""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    pytest.importorskip("flashinfer")
    path = request.getfixturevalue(fixture)
    tokens = {}
    for max_bs in (0, 8):
        h = start(2, path, device="cuda", dtype="bfloat16", attention_backend="fi",
                  page_size=16, cuda_graph_max_bs=max_bs)
        h.users(PROMPTS[:4], 24)
        h.wait(range(4))
        tokens[max_bs] = [h.tokens[u] for u in range(4)]
        reports = h.exit()
        assert [r[0] for r in reports] == [0, 1] and len({r[1:] for r in reports}) == 1
        assert reports[0][3] == ((1, 2, 4, 8) if max_bs else ())
    assert len({t for ts in tokens[0] for t in ts}) > 8, "a few tokens repeated: this test would catch little"
    assert tokens[8] == tokens[0]


def test_with_the_tokenizer_process(tiny_qwen3) -> None:
    """分词进程 + 调度器进程：TokenizeMsg 进、UserReply 出，文字与离线 LLM 的相同。"""
    from minisgl.message import BatchFrontendMsg, TokenizeMsg
    from minisgl.tokenizer import tokenize_worker

    texts = ["你好，", "The capital of France is", "1, 2, 3,"]
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    llm = LLM(tiny_qwen3, **SMALL)
    want = [o["text"] for o in llm.generate(texts, params, use_tqdm=False)]
    llm.shutdown()
    d = tempfile.mkdtemp(prefix="ch14")
    config = SchedulerConfig(tiny_qwen3, **SMALL,
                             zmq_backend_addr=f"ipc://{d}/backend", zmq_detokenizer_addr=f"ipc://{d}/detok")
    frontend: ZmqPullQueue = ZmqPullQueue(f"ipc://{d}/frontend", create=True)
    ctx = mp.get_context("spawn")
    ack = ctx.Queue()
    (scheduler,) = start_scheduler_processes(config, ack)  # 默认入口：run_scheduler_process
    detok = ctx.Process(target=tokenize_worker, kwargs=dict(
        tokenizer_path=str(tiny_qwen3), addr=config.zmq_detokenizer_addr, create=True,
        backend_addr=config.zmq_backend_addr, frontend_addr=f"ipc://{d}/frontend", ack_queue=ack))
    detok.start()
    api: ZmqPushQueue = ZmqPushQueue(config.zmq_detokenizer_addr, create=False)
    to_scheduler: ZmqPushQueue = ZmqPushQueue(config.zmq_backend_addr, create=False)
    try:
        assert sorted(ack.get(timeout=120) for _ in range(2))[0] == "Scheduler is ready"
        for uid, text in enumerate(texts):
            api.put(TokenizeMsg(uid, text, params))
        got = {uid: "" for uid in range(len(texts))}
        done: Dict[int, str] = {}
        while len(done) < len(texts):
            msg = frontend.get(timeout=60)
            for r in msg.data if isinstance(msg, BatchFrontendMsg) else [msg]:
                got[r.uid] += r.incremental_output
                if r.finished:
                    done[r.uid] = r.finish_reason
        assert [got[u] for u in range(len(texts))] == want
        assert set(done.values()) == {"length"}
        to_scheduler.put(ExitMsg())
        scheduler.join(60)
        assert scheduler.exitcode == 0
    finally:
        detok.terminate()
        detok.join(30)
        if scheduler.is_alive():
            scheduler.terminate()
        for q in (api, to_scheduler, frontend):
            q.stop()
