# Tangled from book/chapters/ch12_message_zmq.ipynb — edit the notebook, not this file.
"""第 12 章：每种消息的往返、错误信息；两个进程之间的 PUSH/PULL、PUB/SUB 和 asyncio 队列。"""
from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing as mp
import os
import pickle
import signal
import tempfile
import time
from typing import Any, List

import msgpack
import psutil
import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.message import (AbortBackendMsg, AbortMsg, BatchBackendMsg, BatchFrontendMsg, BatchTokenizerMsg,
                             DetokenizeInfoMsg, DetokenizeMsg, ExitMsg, SchedulerStats, TokenizeMsg, UserMsg,
                             UserReply, decode, encode, message_types, serialize_type)
from minisgl.utils.mp import (ZmqAsyncPullQueue, ZmqAsyncPushQueue, ZmqPubQueue, ZmqPullQueue, ZmqPushQueue,
                              ZmqSubQueue, watch_parent)


def assert_same(a: Any, b: Any, where: str = "msg") -> None:
    """逐字段比较：类型相同；张量的 dtype、形状、字节相同；其余相等。"""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), f"{where}: bytes differ"
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, list):
        assert len(a) == len(b), f"{where}: {len(a)} items vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def short_addr(name: str) -> str:
    return f"ipc://{tempfile.mkdtemp(prefix='zmq')}/{name}"  # ipc 路径不能超过 107 个字符


def sample_messages() -> List[Any]:
    sp = SamplingParams(temperature=0.6, top_k=20, top_p=0.95, ignore_eos=True, max_tokens=7, seed=2**63 - 1,
                        stop_token_ids=[151645, 151643])
    tensors = [torch.arange(5, dtype=torch.int32), torch.tensor([-(2**62), 2**62 + 1], dtype=torch.int64),
               torch.tensor([0.1, -3.5e38, float("inf")], dtype=torch.float32),
               torch.tensor([1.5, -0.0078125], dtype=torch.bfloat16), torch.empty(0, dtype=torch.int32)]
    users = [UserMsg(uid=i, input_ids=t, sampling_params=sp) for i, t in enumerate(tensors)]
    chat = [{"role": "system", "content": "你是助手 🤖"}, {"role": "user", "content": "\u0000 \ud7ff é"}]
    return [
        *users, AbortBackendMsg(uid=2**40), ExitMsg(), BatchBackendMsg([]),
        BatchBackendMsg([users[0], AbortBackendMsg(uid=1), BatchBackendMsg([users[3], ExitMsg()])]),
        TokenizeMsg(uid=0, text="北京在哪里？😀", sampling_params=SamplingParams()),
        TokenizeMsg(uid=1, text=chat, sampling_params=sp, chat_options={"enable_thinking": False, "n": None},
                    stop=["\n\n", "。", ""]),
        TokenizeMsg(uid=2, text=[9707, 11, 0], sampling_params=sp),
        DetokenizeMsg(uid=5, next_token=0, finished=False, cached_tokens=64),
        DetokenizeMsg(uid=5, next_token=151645, finished=True, finish_reason="stop", logprob=-0.25,
                      top_ids=[151645, 13], top_logprobs=[-0.25, -float("inf")]),
        AbortMsg(uid=9), DetokenizeInfoMsg(uid=3, prompt_tokens=1000, stop=["Observation:"]),
        BatchTokenizerMsg([DetokenizeMsg(uid=u, next_token=u, finished=False) for u in range(3)] + [AbortMsg(4)]),
        UserReply(uid=1, incremental_output="", finished=False),
        UserReply(uid=1, incremental_output="你好，世界 👋🏽", finished=True, finish_reason="length",
                  prompt_tokens=12, completion_tokens=34, cached_tokens=8,
                  logprobs=[{"token": "你", "bytes": [228, 189, 160], "logprob": -1.5, "top_logprobs": []}]),
        UserReply(uid=2, incremental_output="", finished=True, finish_reason="abort", error="max_tokens=9 is too large"),
        SchedulerStats(running=3, waiting=1, pages_used=10, pages_cached=5, pages_free=85, cached_tokens=2**40),
        BatchFrontendMsg([UserReply(uid=u, incremental_output=str(u), finished=u == 1) for u in range(2)]),
    ]


def test_round_trip_every_message() -> None:
    msgs = sample_messages()
    covered = {type(m).__name__ for m in msgs} | {"SamplingParams"}
    bases = {n for n in message_types() if n.startswith("Base")}
    assert covered | bases == set(message_types()), f"untested: {set(message_types()) - covered - bases}"
    for msg in msgs:
        data = encode(msg)
        assert isinstance(data, bytes)
        assert_same(msg, decode(data), type(msg).__name__)
        assert_same(msg, decode(encode(decode(data))), type(msg).__name__)  # 还原出来的还能再发


def test_decoded_tensor_is_writable_and_owns_its_memory() -> None:
    data = encode(UserMsg(uid=0, input_ids=torch.arange(4, dtype=torch.int32), sampling_params=SamplingParams()))
    t = decode(data).input_ids
    t[0] = 42  # 可写，且不影响编码的字节
    assert t.tolist() == [42, 1, 2, 3] and decode(data).input_ids.tolist() == [0, 1, 2, 3]
    view = torch.arange(10, dtype=torch.int64)[2:8:2]  # 不连续的视图：只发这 3 个元素
    assert decode(encode(UserMsg(0, view, SamplingParams()))).input_ids.tolist() == [2, 4, 6]


def test_errors_name_the_bad_value() -> None:
    with pytest.raises(ValueError, match="unknown message type 'Nope'"):
        decode(msgpack.packb({"__type__": "Nope"}))
    with pytest.raises(ValueError, match=r"AbortMsg has no fields \['why'\]"):
        decode(msgpack.packb({"__type__": "AbortMsg", "uid": 1, "why": "x"}))
    with pytest.raises(ValueError, match="unknown tensor dtype 'uint128'"):
        decode(msgpack.packb({"__type__": "Tensor", "dtype": "uint128", "shape": [1], "buffer": b"1234"}))
    with pytest.raises(ValueError, match="needs 8 bytes, got 4"):
        decode(msgpack.packb({"__type__": "Tensor", "dtype": "int32", "shape": [2], "buffer": b"1234"}))
    with pytest.raises(ValueError, match="temperature"):  # 接收端照样检查采样参数
        decode(msgpack.packb({"__type__": "SamplingParams", "temperature": -1.0}))
    with pytest.raises(ValueError, match="__type__"):
        encode(TokenizeMsg(uid=0, text=[{"__type__": "ExitMsg"}], sampling_params=SamplingParams()))
    with pytest.raises(ValueError, match="keys must be strings"):
        serialize_type(TokenizeMsg(uid=0, text="", sampling_params=SamplingParams(), chat_options={1: 2}))

    @dataclasses.dataclass
    class Stranger:
        x: int

    with pytest.raises(ValueError, match="Stranger is not a message type"):
        encode(Stranger(1))
    with pytest.raises(TypeError, match="set"):
        encode(AbortMsg(uid={1}))
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="only CPU tensors"):
            encode(UserMsg(0, torch.zeros(2, device="cuda"), SamplingParams()))
    with pytest.raises(ValueError, match="ipc:///tmp/name"):
        ZmqPushQueue("/tmp/no-scheme", create=True)


def test_msgpack_is_smaller_than_pickle_for_a_batch() -> None:
    batch = BatchBackendMsg([UserMsg(i, torch.zeros(1000, dtype=torch.int32), SamplingParams()) for i in range(8)])
    payload = 8 * 4000
    assert payload < len(encode(batch)) < payload * 1.1  # 几乎只有张量本身的字节（每条消息多三百来个字节的字段名）
    assert len(encode(batch)) < len(pickle.dumps(batch))


def _pusher(addr: str, n: int) -> None:
    q: ZmqPushQueue = ZmqPushQueue(addr, create=False)
    for i in range(n):
        q.put(DetokenizeMsg(uid=i % 7, next_token=i, finished=False))
    q.put(ExitMsg())
    q.stop()  # LINGER：stop 之前排队的消息照样发出去


def test_push_pull_between_processes_keeps_order() -> None:
    addr = short_addr("pp")
    pull: ZmqPullQueue = ZmqPullQueue(addr, create=True)
    proc = mp.get_context("spawn").Process(target=_pusher, args=(addr, 500))
    proc.start()
    got = []
    while not isinstance(msg := pull.get(timeout=60), ExitMsg):
        got.append(msg)
    proc.join(30)
    assert proc.exitcode == 0
    assert [m.next_token for m in got] == list(range(500)) and [m.uid for m in got[:8]] == [0, 1, 2, 3, 4, 5, 6, 0]
    with pytest.raises(TimeoutError, match="within 0.05 s"):
        pull.get(timeout=0.05)
    assert pull.empty()
    pull.stop()


def _subscriber(addr: str, ready: Any, n: int, out_addr: str) -> None:
    sub: ZmqSubQueue = ZmqSubQueue(addr, create=False)
    back: ZmqPushQueue = ZmqPushQueue(out_addr, create=False)
    while isinstance(msg := sub.get(timeout=60), AbortMsg):  # 探测消息：说明订阅已经生效
        ready.set()
    got = [msg] + [sub.get(timeout=60) for _ in range(n - 1)]
    back.put(BatchTokenizerMsg(got))
    back.stop()
    sub.stop()


def test_pub_sub_between_processes_keeps_order() -> None:
    addr, out_addr = short_addr("pub"), short_addr("back")
    ctx = mp.get_context("spawn")
    ready, back = ctx.Event(), ZmqPullQueue(out_addr, create=True)
    pub: ZmqPubQueue = ZmqPubQueue(addr, create=True)
    proc = ctx.Process(target=_subscriber, args=(addr, ready, 200, out_addr))
    proc.start()
    while not ready.is_set():  # 慢加入者：订阅生效之前发布的消息会丢，先发探测消息直到对方收到
        pub.put(AbortMsg(uid=-1))
        ready.wait(0.01)
    sent = [DetokenizeMsg(uid=1, next_token=i, finished=i == 199) for i in range(200)]
    for msg in sent:
        pub.put(msg)
    got = back.get(timeout=60)
    proc.join(30)
    assert proc.exitcode == 0
    assert_same(BatchTokenizerMsg(sent), got)
    pub.stop()
    back.stop()


def test_a_1mb_tensor_arrives_intact() -> None:
    addr = short_addr("big")
    pull: ZmqPullQueue = ZmqPullQueue(addr, create=True)
    push: ZmqPushQueue = ZmqPushQueue(addr, create=False)
    msg = UserMsg(uid=1, input_ids=torch.randn(2**18, generator=torch.Generator().manual_seed(0)),
                  sampling_params=SamplingParams())
    assert msg.input_ids.numel() * 4 == 2**20
    push.put(msg)
    assert_same(msg, pull.get(timeout=30))
    push.stop()
    pull.stop()


def test_async_queues_in_one_event_loop() -> None:
    async def main() -> List[Any]:
        addr = short_addr("aio")
        pull: ZmqAsyncPullQueue = ZmqAsyncPullQueue(addr, create=True)
        push: ZmqAsyncPushQueue = ZmqAsyncPushQueue(addr, create=False)
        ticks = 0

        async def ticker() -> None:  # 接收方等待时，别的协程照样在跑
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())

        async def send_later() -> None:
            for i in range(20):
                await asyncio.sleep(0.002)
                await push.put(UserReply(uid=i, incremental_output="字" * i, finished=i == 19))

        assert pull.empty()  # 还没有消息：异步队列上 empty() 也要即时回答
        sender = asyncio.create_task(send_later())
        got = [await asyncio.wait_for(pull.get(), 30) for _ in range(20)]
        await sender
        assert pull.empty()
        await push.put(UserReply(uid=20, incremental_output="", finished=True))
        for _ in range(3000):  # 消息到达要一点时间：等到 empty() 变成 False（最多约 3 秒）
            if not pull.empty():
                break
            await asyncio.sleep(0.001)
        assert not pull.empty() and (await pull.get()).uid == 20 and pull.empty()
        task.cancel()
        push.stop()
        pull.stop()
        assert ticks >= 5, ticks
        return got

    got = asyncio.run(main())
    assert [r.uid for r in got] == list(range(20)) and got[3].incremental_output == "字字字" and got[-1].finished


def _worker(pid_queue: Any) -> None:
    watch_parent(interval=0.1)
    pid_queue.put(os.getpid())
    time.sleep(120)  # 父进程不死的话，它要睡两分钟


def _launcher(pid_queue: Any) -> None:
    child = mp.get_context("spawn").Process(target=_worker, args=(pid_queue,))
    child.start()
    child.join()


def test_worker_exits_when_its_parent_is_killed() -> None:
    """启动器被 kill -9：它来不及收拾，它 spawn 出来的工作进程自己在一秒之内退出。"""
    ctx = mp.get_context("spawn")
    pids = ctx.Queue()
    launcher = ctx.Process(target=_launcher, args=(pids,))
    launcher.start()
    worker = pids.get(timeout=60)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.join(10)
    t0 = time.monotonic()
    while not gone(worker):
        assert time.monotonic() - t0 < 5, "the worker outlived its killed parent"
        time.sleep(0.05)
    assert time.monotonic() - t0 < 1.0


def gone(pid: int) -> bool:
    """进程已经退出（不在了，或者只剩一个等着被收割的僵尸条目）。"""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
