"""第 14 章练习的参考答案。"""
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
    got = [False] * ch.num_subscribers
    for rounds in range(1, max_rounds + 1):
        ch.publish(PROBE)
        got = [g or ch.poll(i) for i, g in enumerate(got)]  # 收到过就算：探针留在队列里
        if all(got):
            return rounds
        ch.tick()
    raise TimeoutError(f"the subscribers did not all join within max_rounds={max_rounds}")


def _next(ch: PubSub, i: int) -> str:
    while True:
        msg = ch.recv(i)
        if msg != PROBE:
            return msg


def broadcast_steps(ch: PubSub, arrivals: List[List[str]], max_per_step: int) -> List[List[List[str]]]:
    if max_per_step < 1:
        raise ValueError(f"max_per_step must be >= 1, got {max_per_step}")
    queue: Deque[str] = deque()
    steps: List[List[List[str]]] = []
    s = 0
    while s < len(arrivals) or queue:
        if s < len(arrivals):
            queue.extend(arrivals[s])
        mine = [queue.popleft() for _ in range(min(max_per_step, len(queue)))]
        for msg in mine:
            ch.publish(msg)
        n = len(mine)  # "广播"条数
        steps.append([mine] + [[_next(ch, i) for _ in range(n)] for i in range(ch.num_subscribers)])
        s += 1
    return steps
