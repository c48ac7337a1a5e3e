# Tangled from book/chapters/ch13_tokenizer.ipynb — edit the notebook, not this file.
from __future__ import annotations

import functools
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Sequence, Tuple

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
    spans: List[Tuple[int, int]] = field(default_factory=list)  # ids[:read_offset] 每个的文字在 text 里的 [起, 止)
    cached_tokens: int = 0  # 调度器在第一个 token 上告诉我们的：提示词在前缀缓存里命中了多少
    logprobs: List[Dict[str, Any]] | None = None  # 要了 logprobs 时：ids 里每个 token 一项（OpenAI 的形状）
    logprobs_sent: int = 0  # logprobs[:logprobs_sent] 已经发出


class DetokenizeManager:
    """token → 文字，每个请求增量地做：不发半个字符，拼起来和一次性 decode 相同；在 stop 字符串前截断。"""

    MAX_FORGOTTEN = 1 << 16

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.states: dict[int, DecodeState] = {}
        self.forgotten: OrderedDict[int, None] = OrderedDict()  # 已经结束、调度器可能还在发 token 的请求
        self._bytes: Dict[int, bytes] = {}  # token id → 它自己的字节（logprobs 用，用到才算）
        self._window = _rust_decode(tokenizer) or self.decode  # 每个 token 两次的窗口解码用它

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

    def logprob_entry(self, msg: DetokenizeMsg) -> Dict[str, Any]:
        """OpenAI 对话接口 logprobs.content 里的一项：这个 token，和这一步最可能的几个 token。"""
        assert msg.logprob is not None
        top = [self._token_info(t, lp) for t, lp in zip(msg.top_ids or [], msg.top_logprobs or [])]
        return {**self._token_info(msg.next_token, msg.logprob), "top_logprobs": top}

    def _token_info(self, token_id: int, logprob: float) -> Dict[str, Any]:
        raw = self._bytes.get(token_id)
        if raw is None:
            raw = self._bytes[token_id] = token_bytes(self.tokenizer, token_id)
        return {"token": raw.decode("utf-8", errors="backslashreplace"), "bytes": list(raw),
                "logprob": max(logprob, -9999.0)}  # JSON 里没有 -inf

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
        s.cached_tokens = s.cached_tokens or msg.cached_tokens
        if not (msg.finished and msg.finish_reason in ("stop", "abort")):  # EOS / stop token 不显示
            s.ids.append(msg.next_token)
            if msg.logprob is not None:
                s.logprobs = s.logprobs if s.logprobs is not None else []
                s.logprobs.append(self.logprob_entry(msg))
                assert len(s.logprobs) == len(s.ids), f"request {msg.uid}: a token came without its logprob"
        _advance(s, self._window, final=msg.finished)
        piece, hit = _take(s, final=msg.finished)
        finished = msg.finished or hit
        if finished:
            del self.states[msg.uid]
            if not msg.finished:
                self._forget(msg.uid)
        return UserReply(uid=msg.uid, incremental_output=piece, finished=finished,
                         finish_reason="stop" if hit else msg.finish_reason,
                         prompt_tokens=s.prompt_tokens if finished else 0,
                         completion_tokens=s.completion_tokens if finished else 0,
                         cached_tokens=s.cached_tokens if finished else 0,
                         logprobs=_take_logprobs(s, finished, hit))


def _rust_decode(tokenizer: Any) -> Callable[[List[int]], str] | None:
    """和 tokenizer.decode(ids, skip_special_tokens=True) 结果相同、直接调 tokenizers（Rust）的解码；
    分词器要清理空格（clean_up_tokenization_spaces）或者不是 fast tokenizer 时没有这条近路，返回 None。"""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    return functools.partial(backend.decode, skip_special_tokens=True)


def _advance(s: DecodeState, decode: Callable[[List[int]], str], final: bool) -> None:
    """把还没确定的 token 解码出来；最后一个字符的字节还没到齐（结尾是 U+FFFD）就先不确定，除非请求结束了。"""
    if s.read_offset == len(s.ids):
        return
    prefix = decode(s.ids[s.prefix_offset : s.read_offset])
    window = decode(s.ids[s.prefix_offset :])
    if window.endswith("\ufffd") and not final:
        return
    assert window.startswith(prefix), (prefix, window)
    start = len(s.text)
    s.text += window[len(prefix) :]
    s.spans += [(start, len(s.text))] * (len(s.ids) - s.read_offset)  # 一起确定的 token 共用这一段文字
    s.prefix_offset, s.read_offset = s.read_offset, len(s.ids)


def _take(s: DecodeState, final: bool) -> Tuple[str, bool]:
    """可以发出去的新文字，以及是否命中了 stop 字符串（命中时文字截到它的前面）。"""
    tail = s.text[s.sent :]
    hits = [i for stop in s.stop if (i := tail.find(stop)) >= 0]
    hit_at = min(hits) if hits else None  # 最靠前的一个完整的 stop 字符串
    end = len(tail) if hit_at is None else hit_at
    if not final and hit_at is None:  # 从 end 之前某处开始、到结尾还没写完的 stop 字符串：从那里起扣着，等下一个 token
        # 再看。已经有一个完整出现时不看：生成在这里就结束，别的 stop 字符串再也写不完
        longest = max((len(stop) for stop in s.stop), default=0)
        for p in range(max(0, len(tail) - longest + 1), end):
            if any(stop.startswith(tail[p:]) for stop in s.stop):
                end = p
                break
    s.sent += end
    return tail[:end], hit_at is not None


def _take_logprobs(s: DecodeState, finished: bool, hit: bool) -> List[Dict[str, Any]] | None:
    """和这一段文字一起发出的 token 的对数概率：文字已经全部发出的 token；结束时再加上文字发出了一部分的。
    每一项加上 text_offset：这个 token 的文字在输出里从第几个字符开始（几个 token 拼成一个字符时，都指向它）。"""
    if s.logprobs is None:
        return None
    first = end = s.logprobs_sent
    if finished and not hit:
        end = len(s.logprobs)  # 正常结束：文字全发出去了
    else:  # 还在生成，或者被 stop 字符串截断：只到已经发出的文字为止
        while end < len(s.spans) and (s.spans[end][1] <= s.sent or (finished and s.spans[end][0] < s.sent)):
            end += 1
    s.logprobs_sent = end
    return [{**e, "text_offset": s.spans[i][0] if i < len(s.spans) else s.sent}
            for i, e in zip(range(first, end), s.logprobs[first:end])]


def _byte_level_alphabet() -> Dict[str, int]:
    """GPT-2 式字节级 BPE 的字母表：256 个字节各用一个可打印的字符表示（可打印的 ASCII 和 Latin-1 就是它自己）。"""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    alphabet, extra = {}, 0
    for b in range(256):
        if b in printable:
            alphabet[chr(b)] = b
        else:  # 空格、控制字符等：借用 U+0100 起的字符（空格就是 Ġ）
            alphabet[chr(256 + extra)] = b
            extra += 1
    return alphabet


_BYTE_LEVEL = _byte_level_alphabet()
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_bytes(tokenizer: Any, token_id: int) -> bytes:
    """一个 token 自己的字节：一个字符被切成几个 token 时，每个 token 是它的一部分字节（不是合法的 UTF-8）。"""
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if piece is None:  # 词表之外：模型的 vocab 比分词器大，随机权重的小模型会生成这样的 id
        return b""
    if token_id in tokenizer.added_tokens_decoder:  # <think>、<|im_end|> 这样整个加进来的：就是它的文字
        return piece.encode()
    if type(tokenizer.backend_tokenizer.decoder).__name__ == "ByteLevel":  # Qwen3、SmolLM2、Llama 3……
        return bytes(_BYTE_LEVEL[c] for c in piece)
    if m := _BYTE_FALLBACK.fullmatch(piece):  # SentencePiece 的字节回退 token
        return bytes([int(m.group(1), 16)])
    return piece.replace("\u2581", " ").encode()  # SentencePiece：▁ 表示空格
