# Tangled from book/chapters/ch13_tokenizer.ipynb — edit the notebook, not this file.
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, List, Sequence, Tuple

from minisgl.message import DetokenizeMsg, UserReply


@dataclass
class DecodeState:
    """一个请求的反分词状态。"""

    stop: List[str] = field(default_factory=list)  # OpenAI 的 stop 字符串
    prompt_tokens: int = 0
    completion_tokens: int = 0  # 调度器送来的 token 数（含结束时的 EOS）
    ids: List[int] = field(default_factory=list)  # 要显示的 token（不含结束时的 EOS / stop token）
    prefix_offset: int = 0  # 解码窗口的起点：往前多带一段已经确定的 token 作上下文
    read_offset: int = 0  # ids[:read_offset] 的文字已经确定，就是 text
    text: str = ""  # 已经确定的文字（不以半个字符结尾）
    sent: int = 0  # text[:sent] 已经发给 API Server


class DetokenizeManager:
    """token → 文字，每个请求增量地做：不发半个字符，拼起来和一次性 decode 相同；在 stop 字符串前截断。"""

    MAX_FORGOTTEN = 1 << 16

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.states: dict[int, DecodeState] = {}
        self.forgotten: OrderedDict[int, None] = OrderedDict()  # 已经结束、调度器可能还在发 token 的请求

    def decode(self, ids: Sequence[int]) -> str:
        """一次性解码：增量输出拼起来必须等于它。"""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def add_request(self, uid: int, prompt_tokens: int = 0, stop: Sequence[str] = ()) -> None:
        if uid in self.forgotten:  # 还没开始就已经中止了
            return
        s = self.states.setdefault(uid, DecodeState())  # 第一个 token 已经先到了（不等登记的进程）：补上
        s.stop, s.prompt_tokens = [x for x in stop if x], prompt_tokens

    def abort(self, uid: int) -> None:
        self.states.pop(uid, None)
        self._forget(uid)

    def knows(self, uid: int) -> bool:
        """uid 登记过（还在解码，或者已经中止 / 命中 stop）。"""
        return uid in self.states or uid in self.forgotten

    def _forget(self, uid: int) -> None:
        self.forgotten[uid] = None
        if len(self.forgotten) > self.MAX_FORGOTTEN:
            self.forgotten.popitem(last=False)

    def detokenize(self, msg: DetokenizeMsg) -> UserReply | None:
        """消化一个 token，返回这一步的回复；已经结束的请求返回 None。

        回复 finished 而 msg 没有 finished：stop 字符串命中了，调用方要通知调度器中止这个请求。
        """
        s = self.states.get(msg.uid)
        if s is None:
            if msg.uid in self.forgotten:  # 命中 stop 或被中止之后，路上还有几个 token
                if msg.finished:
                    del self.forgotten[msg.uid]
                return None
            s = self.states[msg.uid] = DecodeState()  # 没有登记过（例如直接给调度器发 UserMsg 的测试）
        aborted = msg.finished and msg.finish_reason == "abort"  # 中止的消息不带 token（next_token 是 -1）
        s.completion_tokens += not aborted
        if not (msg.finished and msg.finish_reason in ("stop", "abort")):  # EOS / stop token 不显示
            s.ids.append(msg.next_token)
        _advance(s, self.decode, final=msg.finished)
        piece, hit = _take(s, final=msg.finished)
        finished = msg.finished or hit
        if finished:
            del self.states[msg.uid]
            if not msg.finished:
                self._forget(msg.uid)
        return UserReply(uid=msg.uid, incremental_output=piece, finished=finished,
                         finish_reason="stop" if hit else msg.finish_reason,
                         prompt_tokens=s.prompt_tokens if finished else 0,
                         completion_tokens=s.completion_tokens if finished else 0)


def _advance(s: DecodeState, decode: Callable[[List[int]], str], final: bool) -> None:
    """把还没确定的 token 解码出来；最后一个字符的字节还没到齐（结尾是 U+FFFD）就先不确定，除非请求结束了。"""
    if s.read_offset == len(s.ids):
        return
    prefix = decode(s.ids[s.prefix_offset : s.read_offset])
    window = decode(s.ids[s.prefix_offset :])
    if window.endswith("\ufffd") and not final:
        return
    assert window.startswith(prefix), (prefix, window)
    s.text += window[len(prefix) :]
    s.prefix_offset, s.read_offset = s.read_offset, len(s.ids)


def _take(s: DecodeState, final: bool) -> Tuple[str, bool]:
    """可以发出去的新文字，以及是否命中了 stop 字符串（命中时文字截到它的前面）。"""
    tail = s.text[s.sent :]
    hits = [i for stop in s.stop if (i := tail.find(stop)) >= 0]
    hit_at = min(hits) if hits else None  # 最靠前的一个完整的 stop 字符串
    end = len(tail) if hit_at is None else hit_at
    if not final:  # 从 end 之前某处开始、到结尾还没写完的 stop 字符串：从那里起扣着，等下一个 token 再看
        longest = max((len(stop) for stop in s.stop), default=0)
        for p in range(max(0, len(tail) - longest + 1), end):
            if any(stop.startswith(tail[p:]) for stop in s.stop):
                end, hit_at = p, None
                break
    s.sent += end
    return tail[:end], hit_at is not None
