"""附录练习：流式切出工具调用（参考答案）。"""
from __future__ import annotations

import json
from typing import Dict, List, Set, Tuple

START, END = "<tool_call>", "</tool_call>"


def held(text: str, mark: str) -> int:
    """text 末尾最长的、是 mark 的真前缀（比 mark 短）的那一段有多长；没有时 0。"""
    return next((m for m in range(len(mark) - 1, 0, -1) if text.endswith(mark[:m])), 0)


def parse_call(body: str, names: Set[str]) -> Dict[str, str] | None:
    """<tool_call> 和 </tool_call> 之间的文字 → {"name": ..., "arguments": 参数对象的 JSON 文本}；不是合法的调用时 None。"""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    arguments = obj.get("arguments", {})
    if not isinstance(arguments, dict):
        return None
    return {"name": obj["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}


class ToolCallSplitter:
    """把模型一段一段写出来的文字切成给用户的内容和工具调用。"""

    def __init__(self, names: Set[str]) -> None:
        self.names = names
        self.buf = ""  # 还定不下来的文字
        self.inside = False  # buf 在一个 <tool_call> 里
        self.calls = 0  # 交出去了几个调用

    def feed(self, text: str) -> Tuple[str, List[Dict[str, str]]]:
        """喂一段新文字，返回 (现在就能交出的内容, 这一段里写完的调用)。"""
        self.buf += text
        content, calls = [], []
        while True:
            mark = END if self.inside else START
            k = self.buf.find(mark)
            if k < 0:
                if not self.inside:  # 末尾的空白和半个 <tool_call> 扣着
                    done = self.buf[:len(self.buf) - held(self.buf, START)].rstrip()
                    content.append(done)
                    self.buf = self.buf[len(done):]
                return "".join(content), calls
            head, self.buf = self.buf[:k], self.buf[k + len(mark):]
            if not self.inside:
                content.append(head.rstrip())  # 紧挨在 <tool_call> 前面的空白不算内容
            else:
                call = parse_call(head, self.names)
                if call is None:
                    content.append(START + head + END)
                else:
                    calls.append(call)
                    self.calls += 1
            self.inside = not self.inside

    def finish(self) -> Tuple[str, List[Dict[str, str]]]:
        """回答结束：把扣着的文字交出来（没写完的调用原样算内容）。"""
        text, self.buf = self.buf, ""
        if self.inside:
            text, self.inside = START + text, False
        return (text.rstrip() if self.calls else text), []
