# Tangled from book/chapters/ch12_message_zmq.ipynb — edit the notebook, not this file.
from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from typing import Any, Callable, Generic, Tuple, TypeVar

import zmq
import zmq.asyncio

T = TypeVar("T")
Encoder = Callable[[Any], bytes]
Decoder = Callable[[bytes], Any]


def _default_codec() -> Tuple[Encoder, Decoder]:
    # utils 是最底层，不能在模块顶部导入上层的 minisgl.message；用到默认编解码时才导入
    from minisgl.message.utils import decode, encode

    return encode, decode


class _ZmqSocket:
    KIND: int = -1

    def __init__(self, addr: str, create: bool, encode: Encoder | None = None, decode: Decoder | None = None,
                 asyncio: bool = False) -> None:
        if not addr.startswith(("ipc://", "tcp://", "inproc://")):
            raise ValueError(f"a ZMQ address looks like ipc:///tmp/name or tcp://host:port, got {addr!r}")
        if encode is None or decode is None:
            default_encode, default_decode = _default_codec()
            encode, decode = encode or default_encode, decode or default_decode
        self.addr, self.encode, self.decode = addr, encode, decode
        self.context = zmq.asyncio.Context() if asyncio else zmq.Context()
        self.socket = self.context.socket(self.KIND)
        self.socket.setsockopt(zmq.LINGER, 1000)  # stop() 时最多再花 1 秒把没发完的消息发出去
        self.socket.bind(addr) if create else self.socket.connect(addr)

    def empty(self) -> bool:
        """没有已经到达、等着被取走的消息（只对接收端有意义）。读 socket 的 EVENTS：同步、异步的 socket 都即时回答
        （异步 socket 的 poll() 返回的是一个 future）。"""
        return not self.socket.get(zmq.EVENTS) & zmq.POLLIN

    def _wait(self, timeout: float | None) -> None:
        if timeout is not None and self.socket.poll(timeout=int(timeout * 1000)) == 0:
            raise TimeoutError(f"no message on {self.addr} within {timeout} s")

    def stop(self) -> None:
        self.socket.close()
        self.context.term()


class ZmqPushQueue(_ZmqSocket, Generic[T]):
    """PUSH：每条消息交给一个 PULL 端。"""

    KIND = zmq.PUSH

    def put(self, obj: T) -> None:
        self.socket.send(self.encode(obj), copy=False)

    def put_raw(self, data: bytes) -> None:
        self.socket.send(data, copy=False)


class ZmqPullQueue(_ZmqSocket, Generic[T]):
    """PULL：按到达顺序取出消息。get(timeout) 超时抛 TimeoutError。"""

    KIND = zmq.PULL

    def get(self, timeout: float | None = None) -> T:
        return self.decode(self.get_raw(timeout))

    def get_raw(self, timeout: float | None = None) -> bytes:
        self._wait(timeout)
        return self.socket.recv()


class ZmqPubQueue(ZmqPushQueue[T]):
    """PUB：每条消息给每个已经订阅上的 SUB 端（订阅上之前发的会丢）。"""

    KIND = zmq.PUB


class ZmqSubQueue(ZmqPullQueue[T]):
    """SUB：订阅全部消息。"""

    KIND = zmq.SUB

    def __init__(self, addr: str, create: bool, encode: Encoder | None = None,
                 decode: Decoder | None = None) -> None:
        super().__init__(addr, create, encode, decode)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")


class ZmqAsyncPushQueue(_ZmqSocket, Generic[T]):
    """给 asyncio 程序（API Server）用的 PUSH：put 是协程，等待时不阻塞事件循环。"""

    KIND = zmq.PUSH

    def __init__(self, addr: str, create: bool, encode: Encoder | None = None,
                 decode: Decoder | None = None) -> None:
        super().__init__(addr, create, encode, decode, asyncio=True)

    async def put(self, obj: T) -> None:
        await self.socket.send(self.encode(obj), copy=False)


class ZmqAsyncPullQueue(_ZmqSocket, Generic[T]):
    KIND = zmq.PULL

    def __init__(self, addr: str, create: bool, encode: Encoder | None = None,
                 decode: Decoder | None = None) -> None:
        super().__init__(addr, create, encode, decode, asyncio=True)

    async def get(self) -> T:
        return self.decode(await self.socket.recv())


def watch_parent(interval: float = 0.5) -> None:
    """在工作进程的主函数开头调用：启动它的进程不在了（哪怕是被 kill -9），这个进程也在 interval 秒内退出。"""
    parent = mp.parent_process()
    ppid = parent.pid if parent is not None else os.getppid()

    def watch() -> None:
        while os.getppid() == ppid:  # 父进程一死，子进程就被过继出去，父进程号随之改变
            time.sleep(interval)
        os._exit(1)  # 不做任何清理：要清理的东西（GPU 显存、套接字）进程一结束操作系统都会收回

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()
