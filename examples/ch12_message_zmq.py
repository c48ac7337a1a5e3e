# Tangled from book/chapters/ch12_message_zmq.ipynb — edit the notebook, not this file.
"""第 12 章：256 个请求的批消息走 msgpack 和 pickle 各多少字节、多少时间；一条消息经 ZMQ ipc 单程多久。"""

import pickle
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import torch

from minisgl.core import SamplingParams
from minisgl.message import BatchBackendMsg, DetokenizeMsg, UserMsg, decode, encode
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue

torch.manual_seed(0)
batch = BatchBackendMsg([UserMsg(uid=i, input_ids=torch.randint(0, 151936, (1000,), dtype=torch.int32),
                                 sampling_params=SamplingParams(temperature=0.7, top_p=0.9, max_tokens=256))
                         for i in range(256)])
small = DetokenizeMsg(uid=3, next_token=151645, finished=True, finish_reason="stop")


def best_of(fn: Callable[[], Any], n: int = 20) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def same(a: BatchBackendMsg, b: BatchBackendMsg) -> bool:
    return len(a.data) == len(b.data) and all(
        x.uid == y.uid and x.input_ids.dtype == y.input_ids.dtype and torch.equal(x.input_ids, y.input_ids)
        and x.sampling_params == y.sampling_params for x, y in zip(a.data, b.data))


payload = sum(m.input_ids.numel() * 4 for m in batch.data)
print(f"256 个 UserMsg（各 1000 个 int32 token），张量本身 {payload} 字节")
print("| 序列化 | 字节数 | 编码 | 解码 | 还原正确 |")
print("|--------|-------:|-----:|-----:|:--------:|")
for name, enc, dec in [("msgpack（本章）", encode, decode),
                       ("pickle", lambda m: pickle.dumps(m, protocol=pickle.HIGHEST_PROTOCOL), pickle.loads)]:
    data = enc(batch)
    ok = same(batch, dec(data))
    assert ok, f"{name} round trip changed the message"
    print(f"| {name} | {len(data)} | {best_of(lambda: enc(batch)) * 1e3:.2f} ms | "
          f"{best_of(lambda: dec(data)) * 1e3:.2f} ms | {ok} |")
print(f"一条 DetokenizeMsg：msgpack {len(encode(small))} 字节，pickle {len(pickle.dumps(small))} 字节")

# 回声服务器：另一个进程，PULL 收到的原始字节原样 PUSH 回来
tmp = tempfile.mkdtemp()
to_echo, from_echo = f"ipc://{tmp}/to_echo", f"ipc://{tmp}/from_echo"
ECHO = f"""
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue
identity = lambda x: x
pull = ZmqPullQueue({to_echo!r}, create=False, encode=identity, decode=identity)
push = ZmqPushQueue({from_echo!r}, create=False, encode=identity, decode=identity)
while (data := pull.get_raw()) != b"exit":
    push.put_raw(data)
"""
send = ZmqPushQueue(to_echo, create=True)
recv = ZmqPullQueue(from_echo, create=True)
echo = subprocess.Popen([sys.executable, "-c", ECHO])
try:
    send.put(small)
    assert recv.get(timeout=60) == small  # 第一趟：等子进程启动、连上
    print("\n| 消息 | 单程延迟（中位数，含编解码） | 只算传输 |")
    print("|------|---------------------------:|---------:|")
    for name, msg, n in [("DetokenizeMsg", small, 2000), ("BatchBackendMsg（256 × 1000 token）", batch, 30)]:
        rtts, raw_rtts = [], []
        data = encode(msg)
        for _ in range(n):
            t0 = time.perf_counter()
            send.put(msg)
            got = recv.get(timeout=10)
            rtts.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            send.put_raw(data)
            recv.get_raw(timeout=10)
            raw_rtts.append(time.perf_counter() - t0)
        assert type(got) is type(msg)
        rtts.sort()
        raw_rtts.sort()
        print(f"| {name} | {rtts[n // 2] / 2 * 1e6:.0f} µs | {raw_rtts[n // 2] / 2 * 1e6:.0f} µs |")
finally:
    send.put_raw(b"exit")
    echo.wait(timeout=30)
    send.stop()
    recv.stop()
