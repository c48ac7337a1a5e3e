"""附录练习：流式切出工具调用。

把下面每个 `raise NotImplementedError(...)` 换成你的实现。要求见同目录的 README.md。
可以自由添加辅助函数和属性；下面几个函数、类和方法的名字和参数不能改。
"""
from __future__ import annotations

import json
from typing import Dict, List, Set, Tuple

START, END = "<tool_call>", "</tool_call>"


def held(text: str, mark: str) -> int:
    """text 末尾最长的、是 mark 的真前缀（比 mark 短）的那一段有多长；没有时 0。"""
    raise NotImplementedError("实现 held")


def parse_call(body: str, names: Set[str]) -> Dict[str, str] | None:
    """<tool_call> 和 </tool_call> 之间的文字 → {"name": ..., "arguments": 参数对象的 JSON 文本}；不是合法的调用时 None。"""
    raise NotImplementedError("实现 parse_call")


class ToolCallSplitter:
    """把模型一段一段写出来的文字切成给用户的内容和工具调用。"""

    def __init__(self, names: Set[str]) -> None:
        raise NotImplementedError("实现 __init__")

    def feed(self, text: str) -> Tuple[str, List[Dict[str, str]]]:
        """喂一段新文字，返回 (现在就能交出的内容, 这一段里写完的调用)。"""
        raise NotImplementedError("实现 feed")

    def finish(self) -> Tuple[str, List[Dict[str, str]]]:
        """回答结束：把扣着的文字交出来（没写完的调用原样算内容）。"""
        raise NotImplementedError("实现 finish")
