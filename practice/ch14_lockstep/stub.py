"""第 14 章练习：rank 0 的广播——探针握手与锁步读取。

把下面每个 `raise NotImplementedError(...)` 换成你的实现。要求见同目录的 README.md。
"""
from __future__ import annotations

from collections import deque
from typing import Deque, List

PROBE = ""  # 握手用的空消息：真正的消息从不为空


class PubSub:
    """模拟的 PUB 端和它的订阅者（给定的代码，不要改）。"""

    def __init__(self, join_after: List[int]) -> None:
        self.join_after = list(join_after)
        self.now = 0
        self.queues: List[Deque[str]] = [deque() for _ in join_after]
        self.dropped = 0  # 发给还没订阅上的订阅者、被丢掉的消息数

    @property
    def num_subscribers(self) -> int:
        return len(self.queues)

    def tick(self) -> None:
        self.now += 1

    def publish(self, msg: str) -> None:
        for i, q in enumerate(self.queues):
            if self.now >= self.join_after[i]:
                q.append(msg)
            else:
                self.dropped += 1

    def poll(self, i: int) -> bool:
        return bool(self.queues[i])

    def recv(self, i: int) -> str:
        if not self.queues[i]:
            raise LookupError(f"subscriber {i} has no message")
        return self.queues[i].popleft()



def handshake(ch: PubSub, max_rounds: int = 100) -> int:
    """发探针直到每个订阅者都收到过一个；返回轮数。超过 max_rounds 轮抛 TimeoutError。"""
    raise NotImplementedError("实现 handshake")


def broadcast_steps(ch: PubSub, arrivals: List[List[str]], max_per_step: int) -> List[List[List[str]]]:
    """每一步 rank 0 取最多 max_per_step 条、转发；其他 rank 恰好读这么多条（跳过 PROBE）。"""
    raise NotImplementedError("实现 broadcast_steps")
