# Tangled from book/chapters/ch17_structured.ipynb — edit the notebook, not this file.
from __future__ import annotations

import functools
import json
import re
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Iterable, List, Sequence, Tuple, TypeVar

import torch

from minisgl.utils import cpu_cores, init_logger

from .mask import allocate_vocab_mask, unpack_vocab_mask

if TYPE_CHECKING:
    import xgrammar

logger = init_logger(__name__)

GRAMMAR_KINDS = ("json_schema", "regex", "ebnf")
THINK_START, THINK_END = "<think>", "</think>"  # 会思考的模型（Qwen3、DeepSeek-R1……）把思考写在这两个标记之间
JSON_OBJECT_SCHEMA = '{"type": "object"}'  # response_format {"type": "json_object"}：任意一个 JSON 对象
GrammarKey = Tuple[str, str]  # (kind, spec)：kind 是 GRAMMAR_KINDS 之一，spec 是 schema / 正则 / EBNF 的原文
T = TypeVar("T")


class Grammar:
    """一个请求的语法状态：xgrammar 的 GrammarMatcher 走到了哪里。"""

    def __init__(self, compiled: xgrammar.CompiledGrammar) -> None:
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled)  # 从头开始：编译结果大家共享，走到哪里是每个请求自己的
        self.vocab_size = compiled.tokenizer_info.vocab_size

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

    @property
    def is_dead(self) -> bool:
        """没走完，却没有一个 token 能接：输出走进了语法里一条走不到头的路（比如正则 x|ab[^\\s\\S] 写完 ab）。
        要填一行掩码：只在 accept 失败之后查。"""
        return not self.is_terminated and not bool(self.allowed().any())

    def allowed(self) -> torch.Tensor:
        """下一个 token 的允许集合 [V] bool，不改变状态。要填一行掩码再展开：只在查死路、查能不能开头时用。"""
        mask = allocate_vocab_mask(1, self.vocab_size)
        self.fill(mask, 0)
        return unpack_vocab_mask(mask, self.vocab_size)[0]


BATCH_FILL_MIN_ROWS = 64  # 受约束的行至少这么多才分给线程：分派本身约 0.3 ms（bench_structured.py 的 fill 表）


def fill_vocab_mask(grammars: Sequence[Grammar | None], mask: torch.Tensor,
                    batch: xgrammar.BatchGrammarMatcher | None = None) -> bool:
    """mask[i] ← 第 i 个请求下一个 token 的允许集合；没有语法、或语法已走完的行全是 1。返回有没有受约束的行。
    batch：给了、且受约束的行不少于 BATCH_FILL_MIN_ROWS 时，一次交给它，由它的几个线程分着填（与逐行填逐位相同）。"""
    rows = []
    for i, g in enumerate(grammars):
        if g is None or g.is_terminated:
            mask[i].fill_(-1)
        elif g.matcher is None:  # 还在思考（ThinkingGrammar，见本附录最后一节）：这一行自己填
            g.fill(mask, i)
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
        vocab, ids = [""] * vocab_size, tokenizer.get_vocab()
        for piece, i in ids.items():
            if i < vocab_size:
                vocab[i] = piece
        for i in set(tokenizer.all_special_ids) - set(info.stop_token_ids):
            if i < vocab_size:
                vocab[i] = ""
        self.info = xgr.TokenizerInfo.from_vocab_and_metadata(vocab, info.dump_metadata())
        self.batch_threads = min(max_threads, cpu_cores())  # 编译和成批填掩码都用这么多线程：比核多只会互相抢
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=self.batch_threads, cache_enabled=False)
        self.batch = xgr.BatchGrammarMatcher(max_threads=self.batch_threads)  # 一批的掩码分给几个线程填
        self.vocab_size, self.cache_size = vocab_size, cache_size
        self._cache: OrderedDict[GrammarKey, xgrammar.CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()  # 缓存只在锁里读写：调度器的线程查缓存，编译线程写缓存
        self.hits = self.misses = 0
        # 会思考的模型的两个标记（本附录最后一节）：词表里各是一个 token 时才能让语法等思考写完再管
        self.think = (ids[THINK_START], ids[THINK_END]) if THINK_START in ids and THINK_END in ids else None
        self._pieces = vocab  # 每个 token 的原文（特殊 token 已是空串）：json_compiler 在它上面再去掉一些
        self._json_compiler: xgrammar.GrammarCompiler | None = None
        self._json_lock = threading.Lock()

    @property
    def stop_token_ids(self) -> List[int]:
        return list(self.info.stop_token_ids)

    @property
    def json_compiler(self) -> xgrammar.GrammarCompiler:
        """json_schema 用的编译器：解码出来含控制字符（\\0–\\x1f）的 token 换成空串，一个也不放行。第一次用时才建。"""
        with self._json_lock:
            if self._json_compiler is None:
                import xgrammar as xgr

                pieces, stop = list(self._pieces), set(self.info.stop_token_ids)
                for i, text in enumerate(self.info.decoded_vocab):
                    if i not in stop and any(c < 0x20 for c in text):
                        pieces[i] = ""
                info = xgr.TokenizerInfo.from_vocab_and_metadata(pieces, self.info.dump_metadata())
                self._json_compiler = xgr.GrammarCompiler(info, max_threads=self.batch_threads, cache_enabled=False)
            return self._json_compiler

    def cached(self, kind: str, spec: str) -> xgrammar.CompiledGrammar | None:
        """缓存里有就拿（算一次命中）；没有返回 None，不编译。"""
        key = (kind, spec)
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is not None:
                self._cache.move_to_end(key)
                self.hits += 1
            return compiled

    def compile(self, kind: str, spec: str) -> xgrammar.CompiledGrammar:
        """同一个 (kind, spec) 只编译一次。编译不了、schema 里有保证不了的关键字、编出来的语法连第一个 token 都不放行：
        抛 ValueError（信息以 kind=spec 开头）。可以在别的线程里调用：编译本身在锁外。"""
        compiled = self.cached(kind, spec)
        if compiled is not None:
            return compiled
        with self._lock:
            self.misses += 1
        compiled = _compile_with(self.json_compiler if kind == "json_schema" else self.compiler, kind, spec)
        with self._lock:
            self._cache[(kind, spec)] = compiled
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)  # 最久没用的
        return compiled

    def grammar(self, kind: str, spec: str, reasoning: str | None = None) -> Grammar:
        """一个新请求的语法状态，从头开始：编译结果大家共享，走到哪里是每个请求自己的。"""
        return self.state(self.compile(kind, spec), reasoning)

    def state(self, compiled: xgrammar.CompiledGrammar, reasoning: str | None = None) -> Grammar:
        """编译好的语法 → 一个请求的语法状态。reasoning 是 SamplingParams.reasoning：给了、词表里又有思考的两个标记
        时，语法等思考写完再管（ThinkingGrammar）。"""
        if reasoning is None or self.think is None:
            return Grammar(compiled)
        return ThinkingGrammar(Grammar(compiled), self.think, self.stop_token_ids, opened=reasoning == "opened")


def check_grammar(kind: str, spec: str) -> None:
    """不用模型分词器的检查（收请求时用）：spec 能不能变成语法、JSON Schema 里有没有 xgrammar 保证不了的关键字、
    语法能不能开头；不行就抛 ValueError，信息以 kind=spec 开头。"""
    _compile_with(_byte_compiler(), kind, spec)


def _compile_with(compiler: xgrammar.GrammarCompiler, kind: str, spec: str) -> xgrammar.CompiledGrammar:
    """用这个编译器编译 spec：先查 schema 里有没有保证不了的关键字，编完再查语法能不能开头；不行就抛 ValueError。"""
    if kind == "json_schema":
        _check_schema(spec)
        compiled = _convert(kind, spec, lambda: compiler.compile_json_schema(spec, any_whitespace=False))
    elif kind == "regex":
        compiled = _convert(kind, spec, lambda: compiler.compile_regex(spec))
    elif kind == "ebnf":
        compiled = _convert(kind, spec, lambda: compiler.compile_grammar(spec))
    else:
        raise ValueError(f"unknown grammar kind {kind!r}; expected one of {GRAMMAR_KINDS}")
    _check_can_start(kind, spec, compiled)
    return compiled


@functools.cache
def _byte_compiler() -> xgrammar.GrammarCompiler:
    """check_grammar 用的编译器：词表是 256 个单字节的 token 加一个结束符，不用模型的分词器，编译很快。"""
    import xgrammar as xgr

    info = xgr.TokenizerInfo([bytes([b]) for b in range(256)] + [b"</s>"], stop_token_ids=[256])
    return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)


def _check_can_start(kind: str, spec: str, compiled: xgrammar.CompiledGrammar) -> None:
    """语法的第一步一个 token 也不放行（JSON Schema：除了结束符都不放行——空串不是 JSON）：没有输出能满足它。"""
    allowed = Grammar(compiled).allowed()  # [V] bool
    if kind == "json_schema":
        allowed[compiled.tokenizer_info.stop_token_ids] = False
    if not allowed.any():
        raise ValueError(f"{kind}={_clip(spec)!r}: no output can satisfy it")


# JSON Schema 里 xgrammar 保证不了的关键字（它编出来的文法不理会它们，输出会违反它们）→ 说明
UNENFORCED_KEYWORDS = {
    "not": "the output cannot be kept out of a schema",
    "if": "conditional schemas (if/then/else) are not enforced",
    "then": "conditional schemas (if/then/else) are not enforced",
    "else": "conditional schemas (if/then/else) are not enforced",
    "dependentRequired": "properties that depend on other properties are not enforced",
    "dependentSchemas": "properties that depend on other properties are not enforced",
    "dependencies": "properties that depend on other properties are not enforced",
    "uniqueItems": "the output could repeat items",
    "contains": "the output could miss the items it must contain",
    "minContains": "the output could miss the items it must contain",
    "maxContains": "the output could contain such items too often",
    "oneOf": "exactly one matching branch cannot be enforced; use anyOf if no value can match two branches",
    "$dynamicRef": "dynamic references are not resolved",
    "$recursiveRef": "dynamic references are not resolved",
}
# xgrammar 保证得了的 format（别的它当注解，不管）
FORMATS = ("date", "date-time", "time", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri",
           "uri-reference", "uri-template", "json-pointer", "relative-json-pointer")
# 约束取值的关键字；别的（title、description、default、examples、$defs……）是注解，xgrammar 不管也没关系
CONSTRAINTS = {"type", "enum", "const", "multipleOf", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
               "minLength", "maxLength", "pattern", "format", "minItems", "maxItems", "items", "prefixItems",
               "unevaluatedItems", "minProperties", "maxProperties", "required", "properties", "patternProperties",
               "additionalProperties", "propertyNames", "unevaluatedProperties", "$ref", "anyOf", "allOf"}
# 同一层有这几个时，xgrammar 只按其中最靠前的一个转换，同一层别的约束一概不管 → 改写的建议
COMBINATORS = {"$ref": "move it into the referenced schema", "const": "drop it or change the value",
               "enum": "keep only the values that satisfy it", "anyOf": "repeat it inside every branch",
               "allOf": "move it into the branch"}
SHAPE_KEYWORDS = {"properties", "additionalProperties", "unevaluatedProperties", "items", "prefixItems",
                  "unevaluatedItems"}  # 没有 type 时，xgrammar 看到它们就当作对象或数组；否则任何值都行


def _check_schema(spec: str) -> None:
    """spec 是 JSON、里面没有 xgrammar 保证不了的约束；否则抛 ValueError，说出关键字和它在 schema 里的位置。"""
    reason = _unenforced(_parse_json(spec), "#")
    if reason is not None:
        raise ValueError(f"json_schema={_clip(spec)!r}: {reason}")


def _unenforced(schema: Any, path: str) -> str | None:
    """schema 和它的每一个子 schema 里，第一处 xgrammar 保证不了的约束的说明（path 是 JSON Pointer）；没有返回 None。"""
    if not isinstance(schema, dict):
        return None  # true、false 和别的类型：xgrammar 自己处理（false 和非法的类型它会报错）
    for key, why in UNENFORCED_KEYWORDS.items():
        if key in schema and not (key == "uniqueItems" and schema[key] is False):
            return f"{key} at {path} is not supported: {why}"
    if schema.get("anyOf") == []:
        return f"anyOf at {path} has no branches: no value can match it"
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:
        return f"allOf at {path} has {len(schema['allOf'])} branches and only some are enforced: merge them into one"
    first = next((key for key in COMBINATORS if key in schema), None)
    if first is not None:  # 同一层别的约束会被忽略；枚举的值都合乎 type 时，type 本来就多余
        values = [schema["const"]] if first == "const" else schema["enum"] if first == "enum" else None
        ignored = [k for k in schema if k in CONSTRAINTS and k != first and not (
            k == "type" and isinstance(values, list) and all(_is_type(v, schema["type"]) for v in values))]
        if ignored:
            return f"{ignored[0]} at {path} is ignored next to {first}: {COMBINATORS[first]}"
    elif "type" not in schema and not SHAPE_KEYWORDS & schema.keys():
        loose = [k for k in schema if k in CONSTRAINTS]
        if loose:
            return f"{loose[0]} at {path} needs a type: without one, any value passes"
    types = schema.get("type") if isinstance(schema.get("type"), list) else [schema.get("type")]
    required, properties = schema.get("required"), schema.get("properties")
    if first is None and isinstance(required, list):
        missing = [k for k in required if not (isinstance(properties, dict) and k in properties)]
        if missing:
            return f"required at {path} lists {missing[0]!r}, which is not under properties: describe it there"
    step = schema.get("multipleOf")
    if first is None and step is not None and ("number" in types or "integer" in types and not (
            _is_type(step, "integer") and 1 <= step <= 1024)):
        return f"multipleOf at {path} is supported only for type integer, with a whole number in 1..1024"
    if first is None and "string" in types and schema.get("format", FORMATS[0]) not in FORMATS:
        return f"format {schema['format']!r} at {path} is not supported; supported: {', '.join(FORMATS)}"
    children: List[Tuple[str, Any]] = []
    for key in ("properties", "patternProperties", "$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            children += [(f"{key}/{_pointer(k)}", v) for k, v in schema[key].items()]
    for key in ("prefixItems", "anyOf", "allOf", "items"):
        if isinstance(schema.get(key), list):
            children += [(f"{key}/{i}", v) for i, v in enumerate(schema[key])]
    for key in ("items", "additionalProperties", "propertyNames", "unevaluatedProperties", "unevaluatedItems"):
        if isinstance(schema.get(key), dict):
            children.append((key, schema[key]))
    for where, child in children:
        reason = _unenforced(child, f"{path}/{where}")
        if reason is not None:
            return reason
    return None


def _is_type(value: Any, name: Any) -> bool:
    """value 是不是 JSON Schema 的类型 name（或类型列表里的一个）。布尔值不是数，1.0 是整数。"""
    if isinstance(name, list):
        return any(_is_type(value, n) for n in name)
    if not isinstance(name, str) or (name in ("integer", "number") and isinstance(value, bool)):
        return False
    if name == "integer":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    kinds = {"string": str, "number": (int, float), "boolean": bool, "null": type(None), "object": dict, "array": list}
    return isinstance(value, kinds.get(name, ()))


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")  # JSON Pointer 的转义


def _parse_json(spec: str) -> Any:
    try:
        return json.loads(spec)
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


class ThinkingGrammar(Grammar):
    """会思考的模型的语法状态：语法只管思考之后的回答。start：回答可以先写 <think>，也可以直接写语法允许的 token
    → think：</think> 之前什么都行，只是不能结束 → answer：交给原来的语法。opened：提示词已经开了 <think>，从 think
    开始。"""

    def __init__(self, inner: Grammar, think: Tuple[int, int], stop_token_ids: List[int], opened: bool) -> None:
        self.inner, self.vocab_size = inner, inner.vocab_size
        self.think_start, self.think_end = think
        self.stop_token_ids = stop_token_ids
        self.state = "think" if opened else "start"

    @functools.cached_property
    def grammar_thinks(self) -> bool:
        """语法自己就允许回答以 <think> 开头（它连思考也规定了，比如一条写出整段回答的 EBNF）：那就全交给语法。"""
        return bool(self.inner.allowed()[self.think_start])

    @property
    def matcher(self) -> xgrammar.GrammarMatcher | None:
        """回答里就是原来语法的状态（可以成批填掩码）；回答之前没有：这一行由 fill 自己填。"""
        return self.inner.matcher if self.state == "answer" else None

    def fill(self, mask: torch.Tensor, row: int) -> None:
        if self.state == "think":
            mask[row].fill_(-1)
            _set_bits(mask, row, self.stop_token_ids, False)
            return
        self.inner.fill(mask, row)
        if self.state == "start":
            _set_bits(mask, row, [self.think_start], True)

    def accept(self, token: int) -> bool:
        if self.state == "think":
            if token in self.stop_token_ids:
                return False
            if token == self.think_end:
                self.state = "answer"
            return True
        if self.state == "start" and token == self.think_start and not self.grammar_thinks:
            self.state = "think"
            return True
        if not self.inner.accept(token):
            return False
        self.state = "answer"
        return True

    @property
    def is_terminated(self) -> bool:
        return self.state == "answer" and self.inner.is_terminated


def _set_bits(mask: torch.Tensor, row: int, tokens: Iterable[int], allowed: bool) -> None:
    """原地把 mask[row] 里这几个 token 的位设成 1（allowed）或 0。用 Python 的整数一个一个改：只给几个 token 用。"""
    for token in tokens:
        w, bit = divmod(token, 32)
        word = int(mask[row, w]) & 0xFFFFFFFF
        word = word | (1 << bit) if allowed else word & ~(1 << bit)
        mask[row, w] = word - (1 << 32) if word >= 1 << 31 else word  # 回到 int32 的有符号表示
