"""第 13 章练习：流式 UTF-8 解码。

把下面每个 `raise NotImplementedError(...)` 换成你的实现。要求见同目录的 README.md。
可以自由添加辅助函数和属性；下面几个公开函数、方法的名字和参数不能改。
"""
from __future__ import annotations


def incomplete_tail(data: bytes) -> int:
    """data 结尾有几个字节是一个还没写完、但到目前为止合法的字符的开头（0 到 3）。"""
    raise NotImplementedError("实现 incomplete_tail")


class Utf8Stream:
    """字节一段一段地进来，文字一段一段地出去；不发半个字符。"""

    def __init__(self) -> None:
        raise NotImplementedError("实现 Utf8Stream.__init__")

    def feed(self, chunk: bytes) -> str:
        raise NotImplementedError("实现 feed")

    def finish(self) -> str:
        raise NotImplementedError("实现 finish")
