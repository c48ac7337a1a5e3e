"""第 13 章练习：流式 UTF-8 解码（参考答案）。"""
from __future__ import annotations

from typing import Tuple


def _shape(lead: int) -> Tuple[int, int, int]:
    """首字节 → (字符的字节数, 第二个字节的下界, 上界)；不是合法首字节返回 (0, 0, 0)。"""
    if lead < 0x80:
        return 1, 0, 0
    if 0xC2 <= lead <= 0xDF:
        return 2, 0x80, 0xBF
    if lead == 0xE0:
        return 3, 0xA0, 0xBF
    if lead == 0xED:
        return 3, 0x80, 0x9F
    if 0xE1 <= lead <= 0xEF:
        return 3, 0x80, 0xBF
    if lead == 0xF0:
        return 4, 0x90, 0xBF
    if 0xF1 <= lead <= 0xF3:
        return 4, 0x80, 0xBF
    if lead == 0xF4:
        return 4, 0x80, 0x8F
    return 0, 0, 0


def incomplete_tail(data: bytes) -> int:
    """data 结尾有几个字节是一个还没写完、但到目前为止合法的字符的开头（0 到 3）。"""
    for i in range(len(data) - 1, max(len(data) - 4, -1), -1):
        if 0x80 <= data[i] <= 0xBF:  # 后续字节：再往前找首字节
            continue
        need, lo, hi = _shape(data[i])
        tail = data[i:]
        if need <= len(tail):  # 写完了，或者根本不是合法的首字节
            return 0
        if len(tail) >= 2 and not lo <= tail[1] <= hi:
            return 0
        return len(tail)  # 其余的后续字节都在 80..BF 里（上面的循环保证了）
    return 0


class Utf8Stream:
    """字节一段一段地进来，文字一段一段地出去；不发半个字符。"""

    def __init__(self) -> None:
        self.pending = b""

    def feed(self, chunk: bytes) -> str:
        data = self.pending + chunk
        keep = incomplete_tail(data)
        self.pending = data[len(data) - keep:]
        return data[: len(data) - keep].decode("utf-8", errors="replace")

    def finish(self) -> str:
        out, self.pending = self.pending.decode("utf-8", errors="replace"), b""
        return out
