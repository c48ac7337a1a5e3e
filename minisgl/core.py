# Tangled from book/chapters/ch06_kvcache.ipynb and ch08_engine.ipynb and ch11_overlap.ipynb and ch17_structured.ipynb — edit the notebooks, not this file.
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, Iterator, List, Literal, Tuple

import torch

if TYPE_CHECKING:
    from minisgl.attention import BaseAttnBackend, BaseAttnMetadata
    from minisgl.kvcache import BaseKVCachePool
    from minisgl.moe import BaseMoeBackend

# T = 这一批的 token 数，B = 请求数，R = 请求槽数（页表的行），S = 每个请求最多的 token 数（页表的列）


GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf")  # 结构化输出的三种约束（附录）


@dataclass(frozen=True)  # 检查只在构造时做一次：之后不能改（要改用 dataclasses.replace，它会再检查一遍）
class SamplingParams:
    """一个请求怎样采样、最多生成多少、要不要 logprobs；字段名与 upstream、OpenAI 接口和 SGLang 一致。"""

    temperature: float = 0.0  # 0 表示贪心
    top_k: int = -1  # -1 表示不限
    top_p: float = 1.0  # 1 表示不限
    min_p: float = 0.0  # 概率不到最大概率的 min_p 倍的词不要；0 表示不限
    ignore_eos: bool = False
    max_tokens: int | None = None  # None：直到 EOS 或上下文装满（调度器接纳请求时换成具体的数）
    seed: int | None = None  # 给了 seed：同一个请求单独跑、或混在任何批里，采样用的随机数都一样
    stop_token_ids: List[int] = field(default_factory=list)
    presence_penalty: float = 0.0  # OpenAI：生成过的词一律减去它
    frequency_penalty: float = 0.0  # OpenAI：生成过的词，生成过几次就减几次
    repetition_penalty: float = 1.0  # HF/vLLM/SGLang：上下文里出现过的词，正 logit 除以它、负的乘以它
    logit_bias: Dict[str, float] = field(default_factory=dict)  # 词的编号（十进制字符串）→ 加到 logit 上
    logprobs: bool = False  # 返回采到的词的 log 概率
    top_logprobs: int = 0  # 另外返回最可能的 N 个词和它们的 log 概率（0..20）
    # 结构化输出（附录）：至多给一个，名字和 SGLang 的一样；(字段名, 原文) 就是语法缓存的键
    json_schema: str | None = None  # JSON Schema（JSON 文本）；OpenAI 的 response_format 由 API Server 换成它
    regex: str | None = None  # 正则：输出必须整个匹配它
    ebnf: str | None = None  # EBNF 文法（xgrammar 的写法，起始规则叫 root）
    # 会思考的模型：语法等思考写完再管。"tagged"：回答可以先写 <think>…</think>；"opened"：提示词已经开了 <think>
    reasoning: str | None = None

    def __post_init__(self) -> None:
        def num(x: object, lo: float, hi: float) -> bool:  # 有限的数（JSON 也能写出 Infinity、NaN）
            return isinstance(x, (int, float)) and not isinstance(x, bool) and lo <= x <= hi and math.isfinite(x)

        def integer(x: object, lo: int, hi: int = 2**63 - 1) -> bool:
            return isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi

        inf = float("inf")
        checks = {
            "temperature": (num(self.temperature, 0, inf), "must be a finite number >= 0 (below 1e-5 means greedy)"),
            "top_k": (self.top_k == -1 or integer(self.top_k, 1), "must be -1 (off) or >= 1"),
            "top_p": (num(self.top_p, 0, 1) and self.top_p > 0, "must be in (0, 1]"),
            "min_p": (num(self.min_p, 0, 1), "must be in [0, 1]"),
            "max_tokens": (self.max_tokens is None or integer(self.max_tokens, 1),
                           "must be >= 1, or None (until EOS or the context is full)"),
            "seed": (self.seed is None or integer(self.seed, -2**63), "must be an integer in [-2**63, 2**63)"),
            "stop_token_ids": (isinstance(self.stop_token_ids, (list, tuple)) and all(
                integer(t, 0) for t in self.stop_token_ids), "must be a list of token ids >= 0"),
            "presence_penalty": (num(self.presence_penalty, -2, 2), "must be in [-2, 2]"),
            "frequency_penalty": (num(self.frequency_penalty, -2, 2), "must be in [-2, 2]"),
            "repetition_penalty": (num(self.repetition_penalty, 0, inf) and self.repetition_penalty > 0,
                                   "must be > 0 (1 means off)"),
            "logit_bias": (isinstance(self.logit_bias, dict) and all(
                isinstance(k, str) and k.isascii() and k.isdigit() and num(v, -100, 100)
                for k, v in self.logit_bias.items()), "must map token ids (decimal strings) to [-100, 100]"),
            "reasoning": (self.reasoning in (None, "tagged", "opened"), "must be None, 'tagged' or 'opened'"),
            "top_logprobs": (integer(self.top_logprobs, 0, 20 if self.logprobs else 0),
                             "must be in [0, 20], and 0 unless logprobs=True"),
        }
        for name in GRAMMAR_FIELDS:
            spec = getattr(self, name)
            checks[name] = (spec is None or (isinstance(spec, str) and spec != ""),
                            "must be a non-empty string")
        for name, (ok, rule) in checks.items():
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} {rule}")
        given = [name for name in GRAMMAR_FIELDS if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"{given[1]}={getattr(self, given[1])!r:.200} cannot be combined with "
                             f"{given[0]}: give at most one of {', '.join(GRAMMAR_FIELDS)}")
        # logit_bias 只解析一次：采样器每一步都要用
        object.__setattr__(self, "_bias", ([int(k) for k in self.logit_bias],  # frozen：不能用 self._bias =
                                           [float(v) for v in self.logit_bias.values()]))

    @property
    def is_greedy(self) -> bool:
        # 小于 1e-5 的 temperature 也当贪心（vLLM 也这样）：1/T 把 logits 放大到 1e6 以上，按概率抽和取最大没有区别
        return self.temperature < 1e-5 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @property
    def grammar(self) -> Tuple[str, str] | None:
        """结构化输出的 (kind, spec)：kind 是 json_schema / regex / ebnf 之一；不受约束时为 None。"""
        for name in GRAMMAR_FIELDS:
            spec = getattr(self, name)
            if spec is not None:
                return name, spec
        return None

    @property
    def logit_bias_ids(self) -> Tuple[List[int], List[float]]:
        """logit_bias 解析成 (词的编号, 偏置) 两个列表。"""
        return self._bias


@dataclass(eq=False)
class Req:
    """一个请求在引擎里的状态。input_ids 在 CPU 上：提示词加上已经生成的 token。"""

    input_ids: torch.Tensor  # [L] int32，CPU
    table_idx: int  # 占用页表的第几行（请求槽）
    cached_len: int  # 前 cached_len 个 token 的 K/V 已经在 KV 池里
    output_len: int  # 最多再生成多少个 token
    uid: int
    sampling_params: SamplingParams = field(default_factory=SamplingParams)

    def __post_init__(self) -> None:
        self.device_len = len(self.input_ids)  # 这一步前向之后，KV 池里有前 device_len 个 token
        self.max_device_len = len(self.input_ids) + self.output_len
        self.host_len = len(self.input_ids)  # CPU 上已有的 token 数，始终等于 len(input_ids)
        self._buffer: torch.Tensor | None = None  # 第一次 append_host 时分配：[max_device_len] int32
        assert 0 <= self.cached_len < self.device_len, f"{self.uid=} {self.cached_len=} {self.device_len=}"

    @property
    def extend_len(self) -> int:
        """这一步要送进模型的 token 数：prefill 时是未缓存的部分，decode 时是 1。"""
        return self.device_len - self.cached_len

    @property
    def remain_len(self) -> int:
        return self.max_device_len - self.device_len

    @property
    def is_chunked(self) -> bool:
        """这一块算完之后，提示词还没有全部进入 KV 池（分块预填充的中间几块）。"""
        return self.device_len < self.host_len

    def complete_one(self) -> None:
        """一步前向做完：送进去的 token 都有了 K/V；新采样的 token 将在下一步送进去。"""
        chunked = self.is_chunked
        self.cached_len = self.device_len
        if not chunked:  # 分块的中间几块：这一步采样出的 token 作废，下一步接着算提示词
            self.device_len += 1

    def append_host(self, token: int) -> None:
        """新 token 写进一块装得下整个请求的缓冲区；input_ids 是它前 host_len 个元素的视图。"""
        if self._buffer is None:
            self._buffer = torch.empty(self.max_device_len, dtype=torch.int32)
            self._buffer[:self.host_len] = self.input_ids
            self._ids_np = self._buffer.numpy()  # 共享内存：写一个元素不经过 torch 的分派
        self._ids_np[self.host_len] = token
        self.host_len += 1
        self.input_ids = self._buffer[:self.host_len]


def token_owner(first: torch.Tensor, T: int) -> torch.Tensor:
    """first [B]（每个请求的第一个 token 在批里的下标，严格递增，first[0] = 0）→ [T]：每个 token 属于第几个请求。"""
    owner = torch.zeros(T, dtype=torch.int64)
    owner[first[1:]] = 1  # 在每个请求的起点记 1，前缀和就是请求的序号
    return owner.cumsum(0)


@dataclass
class Batch:
    """一步前向要算的一组请求。prepare() 之后，张量都在页表所在的设备上。"""

    reqs: List[Req]
    phase: Literal["prefill", "decode"]
    input_ids: torch.Tensor = field(init=False)  # [T] int32
    positions: torch.Tensor = field(init=False)  # [T] int32：每个 token 在自己请求里的位置
    out_loc: torch.Tensor = field(init=False)  # [T] int32：每个 token 的 K/V 写到池子的哪个槽
    attn_metadata: BaseAttnMetadata = field(init=False)  # 注意力后端的 prepare_metadata 填
    padded_reqs: List[Req] = field(init=False)  # reqs，加上第 8 章为 CUDA Graph 补齐的假请求

    def __post_init__(self) -> None:
        self.padded_reqs = self.reqs

    @property
    def size(self) -> int:
        return len(self.reqs)

    @property
    def padded_size(self) -> int:
        return len(self.padded_reqs)

    @property
    def is_prefill(self) -> bool:
        return self.phase == "prefill"

    @property
    def is_decode(self) -> bool:
        return self.phase == "decode"

    def prepare(self, page_table: torch.Tensor, token_pool: torch.Tensor | None = None) -> None:
        """在 CPU 上拼好 input_ids 和 positions，一次拷到设备上；再从页表查出每个 token 的槽号。

        给了 token_pool（[R, S] int32，和页表同形，第 11 章）时，input_ids 在设备上从它里面取。
        每个请求只读三个整数；逐 token 的张量由几个向量化的操作展开，不为每个请求建小张量。
        """
        reqs = self.padded_reqs
        meta = torch.tensor([(r.table_idx, r.cached_len, r.extend_len) for r in reqs], dtype=torch.int32)  # [B, 3]
        rows, cached, lens = meta.unbind(1)  # [B] ×3
        assert len(reqs) > 0 and bool((lens > 0).all()), "empty batch or request"
        assert not self.is_decode or bool((lens == 1).all()), "decode is one token each"
        T = int(lens.sum())
        first = lens.cumsum(0) - lens  # [B]：每个请求的第一个 token 在批里的下标
        owner = token_owner(first, T)  # [T]
        pos = (torch.arange(T) + (cached - first).index_select(0, owner)).int()  # [T]
        rows = rows.index_select(0, owner)  # [T]
        if token_pool is None:
            ids = torch.cat([r.input_ids[r.cached_len:r.device_len] for r in reqs])  # [T]
            host = torch.stack([ids, pos, rows])  # [3, T] int32：一次拷贝
        else:
            host = torch.stack([pos, rows])  # [2, T]
        dev = page_table.device
        if dev.type == "cuda":
            host = host.pin_memory()
        *ids_dev, self.positions, rows = host.to(dev, non_blocking=True).unbind(0)
        self.input_ids = ids_dev[0] if token_pool is None else token_pool[rows, self.positions]  # [T]
        self.out_loc = page_table[rows, self.positions]  # [T]


@dataclass
class Context:
    """每个进程一个：KV 池、页表、注意力和 MoE 后端，以及正在前向的批。"""

    page_size: int
    page_table: torch.Tensor  # [R, S] int32：第 r 个请求槽第 s 个 token 的 K/V 在池子的哪个槽
    kv_cache: BaseKVCachePool
    attn_backend: BaseAttnBackend
    moe_backend: BaseMoeBackend | None = None
    _batch: Batch | None = field(default=None, repr=False)

    @property
    def batch(self) -> Batch:
        if self._batch is None:
            raise RuntimeError("no batch is being run: call the model inside `with ctx.forward_batch(batch):`")
        return self._batch

    @contextmanager
    def forward_batch(self, batch: Batch) -> Iterator[None]:
        assert self._batch is None, "forward_batch is not re-entrant"
        self._batch = batch
        try:
            yield
        finally:
            self._batch = None


_CTX: Context | None = None


def set_global_ctx(ctx: Context | None) -> None:
    global _CTX
    _CTX = ctx


def get_global_ctx() -> Context:
    if _CTX is None:
        raise RuntimeError("no Context set: build an Engine first, or wrap the code in `with use_ctx(ctx):`")
    return _CTX


def current_ctx() -> Context | None:
    """装着的 Context，没有时是 None（不抛异常）：引擎关闭时用它判断装着的是不是自己的。"""
    return _CTX


@contextmanager
def use_ctx(ctx: Context) -> Iterator[Context]:
    """测试和笔记本里用：装上 ctx，退出时恢复原来的那个。"""
    old = _CTX
    set_global_ctx(ctx)
    try:
        yield ctx
    finally:
        set_global_ctx(old)
