# Tangled from book/chapters/ch17_structured.ipynb — edit the notebook, not this file.
from __future__ import annotations

import json
import re
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Iterable, List, Sequence, Tuple, TypeVar

import torch

from minisgl.utils import cpu_cores, init_logger

if TYPE_CHECKING:
    import xgrammar

logger = init_logger(__name__)

GRAMMAR_KINDS = ("json_schema", "regex", "ebnf")
JSON_OBJECT_SCHEMA = '{"type": "object"}'  # response_format {"type": "json_object"}：任意一个 JSON 对象
GrammarKey = Tuple[str, str]  # (kind, spec)：kind 是 GRAMMAR_KINDS 之一，spec 是 schema / 正则 / EBNF 的原文
T = TypeVar("T")


class Grammar:
    """一个请求的语法状态：xgrammar 的 GrammarMatcher 走到了哪里。"""

    def __init__(self, matcher: xgrammar.GrammarMatcher) -> None:
        self.matcher = matcher

    def fill(self, mask: torch.Tensor, row: int) -> None:
        """mask[row] ← 下一个 token 的允许集合（mask: [B, W] int32，CPU）。不改变状态。"""
        self.matcher.fill_next_token_bitmask(mask, row)

    def accept(self, token: int) -> bool:
        """吃进采到的 token、前进一步；token 不合语法时返回 False，状态不变。"""
        return self.matcher.accept_token(token)

    @property
    def is_terminated(self) -> bool:
        """语法走完、并且吃进了结束符：这个请求以 "stop" 结束。"""
        return self.matcher.is_terminated()


BATCH_FILL_MIN_ROWS = 64  # 受约束的行至少这么多才分给线程：分派本身约 0.3 ms（bench_structured.py 的 fill 表）


def fill_vocab_mask(grammars: Sequence[Grammar | None], mask: torch.Tensor,
                    batch: xgrammar.BatchGrammarMatcher | None = None) -> bool:
    """mask[i] ← 第 i 个请求下一个 token 的允许集合；没有语法、或语法已走完的行全是 1。返回有没有受约束的行。
    batch：给了、且受约束的行不少于 BATCH_FILL_MIN_ROWS 时，一次交给它，由它的几个线程分着填（与逐行填逐位相同）。"""
    rows = []
    for i, g in enumerate(grammars):
        if g is None or g.is_terminated:
            mask[i].fill_(-1)
        else:
            rows.append(i)
    if batch is not None and len(rows) >= BATCH_FILL_MIN_ROWS:
        batch.batch_fill_next_token_bitmask([grammars[i].matcher for i in rows], mask, rows)
    else:
        for i in rows:
            grammars[i].fill(mask, i)
    return bool(rows)


class GrammarBackend:
    """把 (kind, spec) 编译成 xgrammar 的 CompiledGrammar 并缓存（LRU）；每个请求拿一个新的 Grammar。"""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Iterable[int] = (), *,
                 cache_size: int = 64, max_threads: int = 8) -> None:
        import xgrammar as xgr

        stop = sorted(set(stop_token_ids)) or None  # 空：用分词器自己的 eos
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop)
        # 特殊 token（<|im_start|> 之类）不是文本：detokenizer 解码时跳过它们，xgrammar 却把它们的字面当文本。
        # 把它们的"文本"换成空串，语法就永远不允许它们；结束符按 id 处理，留着
        vocab = [""] * vocab_size
        for piece, i in tokenizer.get_vocab().items():
            if i < vocab_size:
                vocab[i] = piece
        for i in set(tokenizer.all_special_ids) - set(info.stop_token_ids):
            if i < vocab_size:
                vocab[i] = ""
        self.info = xgr.TokenizerInfo.from_vocab_and_metadata(vocab, info.dump_metadata())
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=max_threads, cache_enabled=False)
        self.batch_threads = min(max_threads, cpu_cores())
        self.batch = xgr.BatchGrammarMatcher(max_threads=self.batch_threads)  # 一批的掩码分给几个线程填
        self.vocab_size, self.cache_size = vocab_size, cache_size
        self._cache: OrderedDict[GrammarKey, xgrammar.CompiledGrammar] = OrderedDict()
        self.hits = self.misses = 0

    @property
    def stop_token_ids(self) -> List[int]:
        return list(self.info.stop_token_ids)

    def compile(self, kind: str, spec: str) -> xgrammar.CompiledGrammar:
        """同一个 (kind, spec) 只编译一次；编译不了时抛 ValueError（信息以 kind=spec 开头）。"""
        key = (kind, spec)
        compiled = self._cache.get(key)
        if compiled is not None:
            self._cache.move_to_end(key)
            self.hits += 1
            return compiled
        self.misses += 1
        if kind == "json_schema":
            _parse_json(spec)
            compiled = _convert(kind, spec, lambda: self.compiler.compile_json_schema(spec, any_whitespace=False))
        elif kind == "regex":
            compiled = _convert(kind, spec, lambda: self.compiler.compile_regex(spec))
        elif kind == "ebnf":
            compiled = _convert(kind, spec, lambda: self.compiler.compile_grammar(spec))
        else:
            raise ValueError(f"unknown grammar kind {kind!r}; expected one of {GRAMMAR_KINDS}")
        self._cache[key] = compiled
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)  # 最久没用的
        return compiled

    def grammar(self, kind: str, spec: str) -> Grammar:
        """一个新请求的语法状态，从头开始：编译结果大家共享，走到哪里是每个请求自己的。"""
        import xgrammar as xgr

        return Grammar(xgr.GrammarMatcher(self.compile(kind, spec)))


def check_grammar(kind: str, spec: str) -> None:
    """不用分词器的检查（收请求时用）：spec 能不能变成语法；不能就抛 ValueError，信息以 kind=spec 开头。"""
    import xgrammar as xgr

    if kind == "json_schema":
        _parse_json(spec)
        _convert(kind, spec, lambda: xgr.Grammar.from_json_schema(spec, any_whitespace=False))
    elif kind == "regex":
        _convert(kind, spec, lambda: xgr.Grammar.from_regex(spec))
    elif kind == "ebnf":
        _convert(kind, spec, lambda: xgr.Grammar.from_ebnf(spec))
    else:
        raise ValueError(f"unknown grammar kind {kind!r}; expected one of {GRAMMAR_KINDS}")


def _parse_json(spec: str) -> None:
    try:
        json.loads(spec)
    except ValueError as e:
        raise ValueError(f"json_schema={_clip(spec)!r} is not valid JSON: {e}") from e


_CPP_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")  # "[19:35:17] /x/y.cc:94: "


def _convert(kind: str, spec: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except RuntimeError as e:  # xgrammar 的 C++ 层报错都是 RuntimeError
        reason = _CPP_PREFIX.sub("", str(e).strip().splitlines()[0])
        raise ValueError(f"{kind}={_clip(spec)!r}: {reason}") from e


def _clip(spec: str, n: int = 120) -> str:
    return spec if len(spec) <= n else spec[:n] + "…"
