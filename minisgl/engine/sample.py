# Tangled from book/chapters/ch08_engine.ipynb — edit the notebook, not this file.
from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import List, Literal, NamedTuple, Sequence, Tuple, Union

import numpy as np
import torch

from minisgl.core import Req, SamplingParams
from minisgl.kernel import race_sample, race_sample_supported, warm_race_sample

# B = 请求数，V = 词表，G = 一组采样的行数，K = 候选词数，P = 要做惩罚的行数，L = 其中最长的上下文，W = ceil(V / 32)

_M64 = 2**64 - 1
U64 = Union[int, np.ndarray]  # 一个 64 位无符号整数，或者一个 uint64 数组


def relative_probs(x: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """x: [G, V] float32 logits → exp((x − max) / T)：没归一化的概率，每行最大的是 1。"""
    m = x.amax(dim=-1, keepdim=True)  # [G, 1]：amax 不找下标，CPU 上比 max(dim) 快一个数量级
    inv_t = temperature.reciprocal()[:, None]  # [G, 1]
    # 先减最大值再乘 1/T：最大的那个正好是 exp(0) = 1。写成一个 addcmul(−max/T + x/T) 会让最大的那个带上
    # x/T 的舍入误差（T 小时是 e^±0.1 以上），min-p 按"最大的是 1"截断，整行都可能被截光
    return (x - m).mul_(inv_t).exp_()  # [G, V]


def top_k_top_p_candidates(x: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                           k_max: int, p_only: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """每行都开了 top-k 或 top-p（top_p < 1）：先 top-k，再在剩下的词上按重新归一化的概率 top-p。

    x: [G, V] float32；top_k: [G] int64（V 表示不截）；top_p: [G] float32（1 表示不截）。k_max 是开了 top-k 的行里
    最大的 k（没有则 0），p_only 表示有行只开了 top-p（这两个在主机上已知）。返回 (w, ids)，都是 [G, K]：按 logit
    降序的前 K 个词的编号，和它们的 exp((x − max)/T)，被截掉的是 0。只开 top-p 的行，CPU 上先看前 max(64, k_max) 名，
    前 K 名的概率和还不到 p 的行 K 翻 8 倍再看；GPU 上直接整行排序（判断"够不够"要读回 CPU，会打断第 11 章的重叠）。
    """
    G, V = x.shape
    inv_t = temperature.reciprocal()  # [G]
    p = torch.where(top_p < 1, top_p, torch.inf)  # top_p = 1：一个也不截（float32 的累加和会略超过 1）
    lse = (x * inv_t[:, None]).logsumexp(dim=-1) if p_only else None  # [G]：只开 top-p 的行按整行归一化
    grow = p_only and not x.is_cuda
    K = V if p_only and x.is_cuda else min(V, max(k_max, 64) if p_only else k_max)
    rows, found = torch.arange(G, device=x.device), []  # rows：还没定下来的行
    while True:
        xs = x if len(rows) == G else x.index_select(0, rows)
        vals, ids = xs.topk(K, dim=-1) if K < V else xs.sort(dim=-1, descending=True)  # [g, K] 降序
        k, pr, it = top_k[rows], p[rows], inv_t[rows]
        w = ((vals - vals[:, :1]) * it[:, None]).exp_()  # [g, K]：第 0 列是 1
        w *= torch.arange(K, device=x.device)[None, :] < k[:, None]  # top-k
        norm = w.sum(dim=-1)  # top-k 之后重新归一化
        if lse is not None:
            norm = torch.where(k < V, norm, (lse[rows] - vals[:, 0] * it).exp())  # 只开 top-p：整行的和
        cum = w.cumsum(dim=-1)
        w *= cum - w <= pr[:, None] * norm[:, None]  # top-p：排在前面的概率之和不超过 p 就留下，第一个总留下
        done = (k < V) | (cum[:, -1] > pr * norm)  # 这一行保留的词都在前 K 名里了
        if not grow or K == V or bool(done.all()):  # CPU 上读一个布尔值不花什么
            found.append((rows, w, ids))
            break
        found.append((rows[done], w[done], ids[done]))
        rows, K = rows[~done], min(V, K * 8)
    out_w = torch.zeros(G, K, device=x.device)
    out_ids = torch.zeros(G, K, dtype=torch.int64, device=x.device)
    for r, w, i in found:  # 先定下来的行候选少：后面补 0（宽度为 0 的词抽不到）
        out_w[r, :w.shape[1]], out_ids[r, :w.shape[1]] = w, i
    return out_w, out_ids


def _mix64(x: U64) -> U64:
    """splitmix64 的终结函数：64 位整数上的一个双射，输入差一位，输出就面目全非。
    x：一个 Python 整数，或者 uint64 的 numpy 数组（逐元素算，乘法自己按 2^64 回绕，结果和整数版一位不差）。"""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def seeded_key(seed: U64, position: U64) -> U64:
    """(seed, 位置) → 一个 64 位整数，只由这两个整数决定，与批里还有谁无关。给两个 uint64 数组时一次算一批。"""
    return _mix64(_mix64(seed) ^ position)


def seeded_uniform(seed: U64, position: U64) -> float | np.ndarray:
    """(seed, 位置) → [0, 1 − 2^-23] 里 2^23 个等距的值之一：seeded_key 的高 23 位。
    给两个 uint64 数组时一次算一批（prepare 里一组的所有行），得到 float64 数组。"""
    return (seeded_key(seed, position) >> 41) / 2**23


def sample_inverse_cdf(w: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """逆 CDF 采样。w: [G, K] 没归一化的概率（被截掉的是 0）；uniform: [G]。→ [G] int64，w 的列号。

    把 w 依次累加成 [0, 总和) 上的一把尺，每个词占一段、长度是它的 w；u·总和落在哪一段就选哪个词。
    """
    cdf = w.cumsum(dim=-1)  # [G, K]：单调不减
    target = uniform[:, None] * cdf[:, -1:]  # [G, 1]：u ≤ 1 − 2^-23，所以 target < 总和
    picked = torch.searchsorted(cdf, target, right=True).squeeze(1)  # 第一个 cdf > target 的词：宽度 0 的选不到
    return picked.clamp_(max=w.shape[1] - 1)  # logits 里有 NaN（模型出了问题）的行也不越界：服务不为一个请求倒下


def apply_penalties(x: torch.Tensor, pen: Penalties) -> None:
    """原地改 x: [B, V]，只碰上下文里出现过的词。repetition（HF/vLLM）看提示词 + 已生成，先做；
    presence/frequency（OpenAI）只数已生成的 token。"""
    col = torch.arange(pen.ids.shape[1], device=x.device)[None, :]  # [1, L]
    valid = col < pen.seq_lens[:, None]  # [P, L]
    ids = torch.where(valid, pen.ids, pen.ids[:, :1])  # 填充的位置指向第 0 个词：写回同一个词的值永远相同
    rows = torch.arange(len(ids), device=x.device) if pen.rows is None else pen.rows
    at = (rows[:, None], ids)  # x[at]: [P, L]，上下文里每个位置的那个词的 logit
    if pen.repetition is not None:
        cur, r = x[at], pen.repetition[:, None]
        x[at] = torch.where(cur > 0, cur / r, cur * r)  # 正的除、负的乘：都往下压；重复的词写入同一个值
    if pen.presence is not None and pen.frequency is not None:
        generated = (valid & (col >= pen.prompt_lens[:, None])).float()  # [P, L]
        counts = torch.zeros(len(ids), x.shape[1], device=x.device).scatter_add_(1, ids, generated)  # [P, V]
        n = counts.gather(1, ids)  # [P, L]：这个位置的词一共生成了几次
        x[at] = x[at] - pen.frequency[:, None] * n - pen.presence[:, None] * (n > 0)


def apply_vocab_mask(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x: [B, V]；mask: [B, W] int32，第 v 个词允许 ⇔ mask[:, v // 32] 的第 v % 32 位是 1。原地把不允许的词设为 -inf。"""
    B, V = x.shape
    shifts = torch.arange(32, dtype=torch.int32, device=x.device)
    allowed = ((mask[:, :, None] >> shifts) & 1).view(B, -1)[:, :V]  # [B, V]：算术右移，第 31 位也对
    return x.masked_fill_(allowed == 0, -torch.inf)


class LogprobsOutput(NamedTuple):
    """模型自己的分布（惩罚、logit_bias、temperature、截断之前的 log_softmax）里的 log 概率。"""

    token_logprobs: torch.Tensor  # [B] float32：采到的词
    top_ids: torch.Tensor  # [B, N] int32：N = 这批里最大的 top_logprobs（可以是 0）
    top_logprobs: torch.Tensor  # [B, N] float32


@dataclass
class SampleGroup:
    """一批里走同一条采样路的若干行，参数已经在设备上。

    kind："full"：没开 top-k/top-p，在整行上做逆 CDF；"candidates"：每行都开了 top-k 或 top-p，只在前 K 名里做逆 CDF
    （这两条是 CPU 上的路）；"flashinfer"：GPU 上没带 seed 的行，整个交给 FlashInfer；"race"：GPU 上其余的行，
    交给 kernel/sample.py 的 race_sample（本章后面）。
    """

    kind: Literal["full", "candidates", "flashinfer", "race"]
    rows: torch.Tensor | None  # [G] int64：这些行在批里的下标；None：整批
    temperatures: torch.Tensor  # [G] float32
    top_k: torch.Tensor  # [G] int64（V 表示这一行不截）
    top_p: torch.Tensor  # [G] float32（1 表示这一行不截）
    min_p: torch.Tensor | None  # [G] float32；整组都没开 min-p 时为 None
    uniform: torch.Tensor | None  # [G] float32：逆 CDF 用的 u（只有 "full"、"candidates" 两组有）
    keys: torch.Tensor | None  # [G] int64：race_sample 的随机数种子（只有 "race" 组有）
    k_max: int = 0  # 开了 top-k 的行里最大的 k（0：整组都没开 top-k）
    any_top_p: bool = False  # 有行开了 top-p（top_p < 1）
    all_top_p: bool = False  # 每行都开了 top-p
    p_only: bool = False  # 有行只开了 top-p、没开 top-k


@dataclass
class Penalties:
    """要做惩罚的 P 行：它们的上下文（提示词 + 已生成）的 token，和三个系数。"""

    rows: torch.Tensor | None  # [P] int64；None：整批
    ids: torch.Tensor  # [P, L] int64：每行前 seq_len 个有效
    prompt_lens: torch.Tensor  # [P] int64：[prompt_len, seq_len) 是已经生成的 token
    seq_lens: torch.Tensor  # [P] int64
    presence: torch.Tensor | None  # [P] float32（presence 和 frequency 整批都是 0 时为 None）
    frequency: torch.Tensor | None
    repetition: torch.Tensor | None  # [P] float32（整批都是 1 时为 None）


@dataclass
class BatchSamplingArgs:
    """一批请求的采样参数，已经在设备上。最常见的情况（全是贪心、什么都不改）只有 greedy=True，其余都是 None。"""

    greedy: bool  # 没有一行要采样：argmax
    mixed: bool = False  # 既有贪心的行、也有采样的行
    top_logprobs: int = -1  # -1：没有请求要 logprobs；否则是这批里最大的 top_logprobs
    logit_bias: Tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (行, 词, 偏置)，各 [E]
    penalties: Penalties | None = None
    groups: List[SampleGroup] = field(default_factory=list)  # 采样的行，按走哪条路分组；不在任何组里的行取 argmax
    vocab_mask: torch.Tensor | None = None  # [B, W] int32，第 v 位为 1 才允许（结构化输出在 prepare 之后填）


class Sampler:
    """logits → 下一个 token（和 logprobs）。prepare 在 CPU 上把一批的参数拼好、一次拷到设备上；sample 只发射设备上的工作。

    没给 seed 的请求：GPU 上交给 FlashInfer 的采样 kernel（随机数来自一个以 random_seed 起始的生成器）；否则和带
    seed 的请求一样，随机数只由 (seed, 位置) 决定（没给的 seed 由 random_seed 和 uid 派生）：GPU 上用 race_sample，
    CPU 上用逆 CDF。
    """

    def __init__(self, device: torch.device, vocab_size: int, random_seed: int,
                 use_flashinfer: bool = True, dtype: torch.dtype = torch.float32) -> None:
        """dtype：模型输出的 logits 的 dtype（GPU 上为它预先编译 race_sample）。"""
        self.device, self.vocab_size, self.random_seed = device, vocab_size, random_seed
        self._fi = _flashinfer_sampling() if use_flashinfer and device.type == "cuda" else None
        self._generator: torch.Generator | None = None  # FlashInfer 用；第一次用时建
        self._race = device.type == "cuda" and race_sample_supported()  # GPU 上有 Triton（装了 CUDA 版 torch 就有）
        if self._fi is not None:  # FlashInfer 第一次用采样 kernel 时现场编译（一分钟上下）：放在启动时，不让第一个请求等
            probs = self._fi.softmax(torch.zeros(1, vocab_size, device=device), temperature=1.0)  # [1, V]
            self._fi.top_p_sampling_from_probs(probs, 0.9, generator=torch.Generator(device=device).manual_seed(0))
        if self._race:  # race_sample 的 kernel 也一样（Triton 编译）：logits 的 dtype，和处理过的 logits 的 float32
            for dt in dict.fromkeys([dtype, torch.float32]):
                warm_race_sample(vocab_size, dt, device)

    def prepare(self, reqs: List[Req], *, token_pool: torch.Tensor | None = None,
                prompt_lens: Sequence[int] | None = None) -> BatchSamplingArgs:
        """token_pool: [R, S] 设备上的 token 表（第 11 章），给了就从它里面读惩罚要的上下文（重叠调度时 CPU 上还缺
        最新的 token）；prompt_lens: 每个请求原始提示词的长度，默认是它创建时 input_ids 的长度。"""
        params = [r.sampling_params for r in reqs]
        if all(p.is_greedy and not (p.logprobs or p.logit_bias or p.has_penalties) for p in params):
            return BatchSamplingArgs(greedy=True)  # 最常见的情况：一次 argmax
        V = self.vocab_size
        sampled = [i for i, p in enumerate(params) if not p.is_greedy]
        mine = [self._fi is None or params[i].seed is not None for i in sampled]  # 随机数由 (seed, 位置) 决定
        ours = [i for i, m in zip(sampled, mine) if m]
        kinds = [("flashinfer", [i for i, m in zip(sampled, mine) if not m])]  # 按标记分，不查 `in`：批大时是平方
        if self._race:  # GPU：一个 kernel 管所有的过滤
            kinds.append(("race", ours))
        else:  # CPU：开了过滤的行在候选上抽
            cut = [0 < params[i].top_k < V or params[i].top_p < 1 for i in ours]
            kinds += [("full", [i for i, c in zip(ours, cut) if not c]), ("candidates", [i for i, c in zip(ours, cut) if c])]
        penalized = [i for i, p in enumerate(params) if p.has_penalties]
        return BatchSamplingArgs(
            greedy=not sampled, mixed=0 < len(sampled) < len(reqs),
            top_logprobs=max(p.top_logprobs if p.logprobs else -1 for p in params),
            logit_bias=self._logit_bias(params) if any(p.logit_bias for p in params) else None,
            penalties=self._penalties(reqs, penalized, token_pool, prompt_lens) if penalized else None,
            groups=[self._group(reqs, rows, kind) for kind, rows in kinds if rows])

    def sample(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """logits: [B, V] → [B] int32。有请求要 logprobs 时不改写 logits（logprobs 要原始的）。"""
        if args.greedy and args.logit_bias is None and args.penalties is None and args.vocab_mask is None:
            return logits.argmax(dim=-1).int()
        x = self._process(logits, args)  # [B, V]
        out = x.argmax(dim=-1).int() if args.greedy or args.mixed else \
            torch.empty(x.shape[0], dtype=torch.int32, device=x.device)
        for g in args.groups:
            tokens = self._sample_group(x if g.rows is None else x.index_select(0, g.rows), g).int()  # [G]
            out = tokens if g.rows is None else out.index_copy_(0, g.rows, tokens)
        return out

    def logprobs(self, logits: torch.Tensor, tokens: torch.Tensor,
                 args: BatchSamplingArgs) -> LogprobsOutput | None:
        """模型自己的分布：原始 logits 的 log_softmax（惩罚、logit_bias、temperature、截断之前）。没人要时是 None。"""
        n = args.top_logprobs
        if n < 0:
            return None
        lp = logits.float().log_softmax(dim=-1)  # [B, V]
        chosen = lp.gather(1, tokens.long()[:, None]).squeeze(1)  # [B]
        top = lp.topk(n, dim=-1)  # n = 0 也可以：[B, 0]
        return LogprobsOutput(chosen, top.indices.int(), top.values)

    # ------------------------------------------------------------------ prepare 的各部分（CPU 上）
    def _to_device(self, host: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":
            return host.pin_memory().to(self.device, non_blocking=True)
        return host.to(self.device)

    def _group(self, reqs: List[Req], rows: List[int], kind: str) -> SampleGroup:
        V = self.vocab_size
        ps = [reqs[i].sampling_params for i in rows]
        ks = [p.top_k if 0 < p.top_k < V else V for p in ps]
        floats = [[p.temperature for p in ps], [p.top_p for p in ps], [p.min_p for p in ps]]
        ints = [np.array(rows, dtype=np.int64), np.array(ks, dtype=np.int64)]
        if kind != "flashinfer":  # 每行的随机数只由 (seed, 要采样的位置) 决定
            seeds = np.array([self._seed(reqs[i]) for i in rows], dtype=np.uint64)
            positions = np.array([reqs[i].device_len for i in rows], dtype=np.uint64)
            if kind == "race":  # 整个哈希当种子：右移一位，放得进 int64
                ints.append((seeded_key(seeds, positions) >> np.uint64(1)).astype(np.int64))
            else:  # 逆 CDF：一个 u
                floats.append(seeded_uniform(seeds, positions).tolist())
        # 经 numpy 拼成张量：torch.tensor 逐个读 Python 列表里的数，批 256 时慢一倍
        f = self._to_device(torch.from_numpy(np.array(floats, dtype=np.float32)))  # [3 或 4, G]
        n = self._to_device(torch.from_numpy(np.stack(ints)))  # [2 或 3, G]
        return SampleGroup(kind=kind, rows=None if len(rows) == len(reqs) else n[0], temperatures=f[0],
                           top_k=n[1], top_p=f[1], min_p=f[2] if any(p.min_p > 0 for p in ps) else None,
                           uniform=f[3] if kind in ("full", "candidates") else None,
                           keys=n[2] if kind == "race" else None,
                           k_max=max((k for k in ks if k < V), default=0), any_top_p=any(p.top_p < 1 for p in ps),
                           all_top_p=all(p.top_p < 1 for p in ps),
                           p_only=any(k == V and p.top_p < 1 for k, p in zip(ks, ps)))

    def _logit_bias(self, params: List[SamplingParams]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows: List[int] = []
        cols: List[int] = []
        vals: List[float] = []
        for i, p in enumerate(params):
            ids, biases = p.logit_bias_ids  # SamplingParams 构造时已经把 "123" 解析成了整数
            assert not ids or max(ids) < self.vocab_size, f"logit_bias {max(ids)=} >= {self.vocab_size=}"
            rows += [i] * len(ids)
            cols += ids
            vals += biases
        n = self._to_device(torch.tensor([rows, cols], dtype=torch.int64))  # [2, E]
        return n[0], n[1], self._to_device(torch.tensor(vals, dtype=torch.float32))

    def _penalties(self, reqs: List[Req], rows: List[int], token_pool: torch.Tensor | None,
                   prompt_lens: Sequence[int] | None) -> Penalties:
        seq = [reqs[i].device_len for i in rows]  # 采样的是第 device_len 个 token：上下文是它前面的全部
        plen = [prompt_lens[i] if prompt_lens is not None else reqs[i].max_device_len - reqs[i].output_len
                for i in rows]
        L = max(seq)
        if token_pool is not None:  # 设备上按流的顺序读：上一步刚采到的 token 已经写在里面了
            slots = self._to_device(torch.tensor([reqs[i].table_idx for i in rows], dtype=torch.int64))
            ids = token_pool[:, :L].index_select(0, slots).long()  # [P, L]
        else:
            host = torch.zeros(len(rows), L, dtype=torch.int64)
            for j, i in enumerate(rows):
                r = reqs[i]
                if len(r.input_ids) < r.device_len:
                    raise RuntimeError(f"request {r.uid}: its newest token is only on the device (overlap "
                                       f"scheduling); pass token_pool= to Sampler.prepare for penalties")
                host[j, :seq[j]] = r.input_ids[:seq[j]]
            ids = self._to_device(host)
        ps = [reqs[i].sampling_params for i in rows]
        f = self._to_device(torch.tensor([[p.presence_penalty for p in ps], [p.frequency_penalty for p in ps],
                                          [p.repetition_penalty for p in ps]], dtype=torch.float32))  # [3, P]
        n = self._to_device(torch.tensor([rows, plen, seq], dtype=torch.int64))  # [3, P]
        additive = any(p.presence_penalty or p.frequency_penalty for p in ps)
        return Penalties(rows=None if len(rows) == len(reqs) else n[0], ids=ids, prompt_lens=n[1], seq_lens=n[2],
                         presence=f[0] if additive else None, frequency=f[1] if additive else None,
                         repetition=f[2] if any(p.repetition_penalty != 1 for p in ps) else None)

    def _seed(self, req: Req) -> int:
        seed = req.sampling_params.seed
        if seed is not None:
            return seed % 2**64  # int64 → uint64（负数按补码）；非负的 seed 不变
        return ((self.random_seed * 0x9E3779B97F4A7C15) ^ (req.uid * 0xBF58476D1CE4E5B9)) & (2**62 - 1)

    # ------------------------------------------------------------------ sample 的各部分（设备上）
    def _process(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """logit_bias → 惩罚 → 结构化输出的掩码。什么都不用改时原样返回（不拷贝）。"""
        if args.logit_bias is None and args.penalties is None and args.vocab_mask is None:
            return logits
        # 之后都原地改 x。要 logprobs 时先拷一份：它要原始的 logits；不要时 float32 的 logits 之后没人再读
        x = logits.float() if args.top_logprobs < 0 else logits.to(torch.float32, copy=True)  # [B, V]
        if args.logit_bias is not None:
            rows, cols, vals = args.logit_bias
            x.index_put_((rows, cols), vals, accumulate=True)
        if args.penalties is not None:
            apply_penalties(x, args.penalties)
        if args.vocab_mask is not None:
            apply_vocab_mask(x, args.vocab_mask)
        return x

    def _sample_group(self, x: torch.Tensor, g: SampleGroup) -> torch.Tensor:
        if g.kind == "flashinfer":
            assert self._fi is not None
            if self._generator is None:  # TP 下各 rank 的 random_seed 相同、调用次序相同，抽出的随机数也相同
                self._generator = torch.Generator(device=self.device).manual_seed(self.random_seed)
            return flashinfer_sample(self._fi, x, g, self._generator)
        if g.kind == "race":
            assert g.keys is not None
            if g.k_max and g.any_top_p:  # 两个都开的行：先截 top-k，kernel 再在剩下的词上做 top-p
                x = keep_top_k(x, g.top_k, g.top_p, g.k_max)
            filtered = g.k_max or g.any_top_p or g.min_p is not None  # 都没开：竞赛一轮就是答案
            return race_sample(x, g.keys, g.temperatures, g.top_k, g.top_p, g.min_p, rounds=None if filtered else 1)
        assert g.uniform is not None
        x = x.float()  # [G, V]（GPU 上 logits 是 bf16）
        if g.kind == "full":
            w, ids = relative_probs(x, g.temperatures), None  # [G, V]
        else:
            w, ids = top_k_top_p_candidates(x, g.temperatures, g.top_k, g.top_p, g.k_max, g.p_only)  # [G, K]
        if g.min_p is not None:  # 最后 min-p（SGLang 的顺序）：w 的最大值是 1，w 就是它与最大概率之比
            w.masked_fill_(w < g.min_p[:, None], 0.0)
        picked = sample_inverse_cdf(w, g.uniform)  # [G]
        return picked if ids is None else ids.gather(1, picked[:, None]).squeeze(1)


def flashinfer_sample(fs: ModuleType, x: torch.Tensor, g: SampleGroup, generator: torch.Generator) -> torch.Tensor:
    """GPU 上没带 seed 的行：FlashInfer 的拒绝采样 kernel，不排序。x: [G, V]（bf16 或 float32）→ [G] int32。"""
    if g.min_p is not None:  # SGLang 的顺序：top-k、top-p 重新归一化之后再 min-p
        return fs.min_p_sampling_from_probs(flashinfer_filtered(fs, x, g), g.min_p, generator=generator)
    probs = fs.softmax(x, temperature=g.temperatures)  # [G, V] float32：一个 kernel 除以 T、做 softmax
    if g.k_max and g.any_top_p:
        return fs.top_k_top_p_sampling_from_probs(probs, g.top_k, g.top_p, filter_apply_order="top_k_first",
                                                  generator=generator)
    if g.k_max:
        return fs.top_k_sampling_from_probs(probs, g.top_k, generator=generator)
    if g.any_top_p:
        return fs.top_p_sampling_from_probs(probs, g.top_p, generator=generator)
    return fs.sampling_from_probs(probs, generator=generator)


def flashinfer_filtered(fs: ModuleType, x: torch.Tensor, g: SampleGroup) -> torch.Tensor:
    """softmax(x / T)，再按 top-k、top-p 截断、重新归一化：FlashInfer 的 kernel，不排序。x: [G, V] → [G, V] float32。"""
    probs = fs.softmax(x, temperature=g.temperatures)  # [G, V] float32：一个 kernel 除以 T、做 softmax
    if g.k_max:
        probs = fs.top_k_renorm_probs(probs, g.top_k)  # k = V 的行一个也不截
    if g.any_top_p:
        cut = fs.top_p_renorm_probs(probs, g.top_p)
        probs = cut if g.all_top_p else torch.where(g.top_p[:, None] < 1, cut, probs)  # top_p = 1 的行原样留下
    return probs


def keep_top_k(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, k_max: int) -> torch.Tensor:
    """x: [G, V] → 新的 [G, V]：top-k 和 top-p 都开的行只留 logit 不小于第 top_k 名的词，其余 −inf；别的行原样
    （只开 top-k 的行由 race_sample 自己数，不必先截：这样它和整组都不开 top-p 时抽到的是同一个词）。"""
    kth = x.topk(k_max, dim=-1).values.gather(1, top_k.clamp(max=k_max)[:, None] - 1)  # [G, 1]：第 k 名的 logit
    both = (top_k < x.shape[1]) & (top_p < 1)  # [G]
    return x.masked_fill((x < kth) & both[:, None], -torch.inf)


def _flashinfer_sampling() -> ModuleType | None:
    try:
        import flashinfer.sampling

        return flashinfer.sampling
    except ImportError:
        return None
