# Tangled from book/chapters/ch08_engine.ipynb — edit the notebook, not this file.
from __future__ import annotations

import os
from typing import Any

import torch

from .fused import triton_kernel

# G = 采样的行数，V = 词表，S = 一行切成的块数：每块 CHUNK 个词，一个程序实例管一块，按 BLOCK 个词一段扫过

BLOCK = 4096  # 一段读 4096 个词
CHUNK = 2 * BLOCK  # 一块 8192 个词，Qwen3 的词表一行 19 块：H100 上批 256、带 top_p 时比 16384 一块快一成
NUM_WARPS = 8  # 每块 8 个 warp：H100 上批 256 时比 4 个快一成
MAX_ROUNDS = 32  # 拒绝这么多轮还没收下（几乎不会发生），就取 logit 最大的词：它总在集合里
# 工作区 ws: [G, 10, S] float32，一行 10 个字段、每块一个值（词的编号也存成 float32，2^24 以内是精确的）：
# 0 块里最大的 logit，1 它的编号；2、3 偶数轮这一块的最高分和赢家，4、5 奇数轮的（下一次 launch 读上一轮的，这一轮
# 写另一对，互不覆盖）；6、7、8 检查：exp((x − m)/T) 的和、其中比赢家大的词的和、这些词的个数；9 这一行定下来没有
# （只用第 0 块那一格）


@triton_kernel
def _kernels(triton: Any, tl: Any) -> Any:
    @triton.jit
    def uniforms(key, start, rnd, V, BLOCK: tl.constexpr):
        """第 rnd 轮给词 start … start + BLOCK − 1 的 [BLOCK] 个 [0, 1) 均匀数。Philox 一次出 4 个数，给相邻的 4 个词：
        词 e 用的计数器是 rnd·V + e // 4，只由 (种子, 第几轮, 第几个词) 决定。"""
        u0, u1, u2, u3 = tl.rand4x(key, start // 4 + tl.arange(0, BLOCK // 4) + rnd * V)
        return tl.reshape(tl.join(tl.join(u0, u1), tl.join(u2, u3)), [BLOCK])  # [BLOCK/4, 2, 2] 按行展开

    @triton.jit
    def race_pass(base, key, lo, hi, floor, inv_t, rnd, V, BLOCK: tl.constexpr):
        """词 [lo, hi) 里 logit 大于 floor 的词赛一轮 → (最高分, 赢家, 最大的 logit, 它的编号)。"""
        best = inv_t * 0.0 - float("inf")
        m = best
        j = (inv_t * 0.0).to(tl.int32)
        top = j
        for b in range(lo, hi, BLOCK):
            offs = b + tl.arange(0, BLOCK)
            x = tl.load(base + offs, mask=offs < hi, other=-float("inf")).to(tl.float32)
            x = tl.where(x == x, x, -float("inf"))  # NaN（模型出了问题）当作抽不到
            xmax = tl.max(x, 0)
            top = tl.where(xmax > m, tl.argmax(x, 0) + b, top)
            m = tl.maximum(m, xmax)
            # 分数 = x/T + Gumbel 噪声，最高的赢；赢家按 exp(x/T) 的比例分布
            gumbel = -tl.log(-tl.log(uniforms(key, b, rnd, V, BLOCK)))
            score = tl.where(x > floor, x * inv_t + gumbel, -float("inf"))
            smax = tl.max(score, 0)
            j = tl.where(smax > best, tl.argmax(score, 0) + b, j)
            best = tl.maximum(best, smax)
        return best, j, m, top

    @triton.jit
    def check_pass(base, lo, hi, xj, m, inv_t, BLOCK: tl.constexpr):
        """词 [lo, hi) 里：exp((x − m)/T) 的和（没归一化的概率，最大的是 1），其中比 xj 大的词的和，这些词的个数。"""
        total = 0.0
        above = 0.0
        count = 0.0
        for b in range(lo, hi, BLOCK):
            offs = b + tl.arange(0, BLOCK)
            x = tl.load(base + offs, mask=offs < hi, other=-float("inf")).to(tl.float32)
            x = tl.where(x == x, x, -float("inf"))
            w = tl.exp((x - m) * inv_t)  # −inf（被掩掉的词）是 0
            heavier = x > xj
            total += tl.sum(w, 0)
            above += tl.sum(tl.where(heavier, w, 0.0), 0)
            count += tl.sum(heavier.to(tl.float32), 0)
        return total, above, count

    @triton.jit
    def keep(total, above, count, xj, m, inv_t, k, p, min_p):
        """赢家在不在 top-k、top-p、min-p 留下的集合里。"""
        return (count < k) & (above <= p * total) & (tl.exp((xj - m) * inv_t) >= min_p)

    @triton.jit
    def gather(w, S, field, SP: tl.constexpr, other):
        """这一行工作区里字段 field 的 S 个值（SP 是 S 向上取的 2 的幂，多出来的填 other）。"""
        ii = tl.arange(0, SP)
        return tl.load(w + field * S + ii, mask=ii < S, other=other)

    @triton.jit
    def merged(w, S, par, SP: tl.constexpr):
        """各块合起来 → (整行最大的 logit m, 它的编号 top, 奇偶为 par 的那一轮的赢家 j：最高分最早出现的那一块的，float32)。"""
        ms = gather(w, S, 0, SP, -float("inf"))
        top = tl.load(w + S + tl.argmax(ms, 0)).to(tl.int32)
        j = tl.load(w + (3 + 2 * par) * S + tl.argmax(gather(w, S, 2 + 2 * par, SP, -float("inf")), 0))
        return tl.max(ms, 0), top, j

    @triton.jit
    def checked(w, S, SP: tl.constexpr, xj, m, inv_t, k, p, min_p):
        """各块的检查结果合起来，判上一轮的赢家收不收。"""
        return keep(tl.sum(gather(w, S, 6, SP, 0.0), 0), tl.sum(gather(w, S, 7, SP, 0.0), 0),
                    tl.sum(gather(w, S, 8, SP, 0.0), 0), xj, m, inv_t, k, p, min_p)

    # Triton 给 constexpr 的每个值、给等于 1 或能被 16 整除的整数、给对没对齐到 16 字节的指针各编译一份（在发射它的
    # 那一步里现场编译）。RND（第几轮）和 HAS_MIN_P（整组开没开 min-p）是运行时的整数，不特化；每行参数的指针也不
    # 特化：一个程序实例只从里面读一个数，对不对齐不影响快慢。于是每个 kernel 对每种 logits 的 dtype 只编译一次
    PER_ROW = ["temperatures", "top_ks", "top_ps", "min_ps", "RND", "HAS_MIN_P"]

    @triton.jit(do_not_specialize=["keys"] + PER_ROW)
    def race_chunk(x_ptr, row_stride, keys, temperatures, top_ks, top_ps, min_ps, out, ws, V, S, RND, HAS_MIN_P,
                   CHUNK: tl.constexpr, BLOCK: tl.constexpr, SP: tl.constexpr):
        row = tl.program_id(0)
        s = tl.program_id(1)  # 这一行的第 s 块：词 [lo, hi)
        lo = s * CHUNK
        hi = tl.minimum(lo + CHUNK, V)
        w = ws + row * 10 * S  # 这一行的工作区：字段 f 的第 s 块在 w + f·S + s
        base = x_ptr + row.to(tl.int64) * row_stride
        inv_t = 1.0 / tl.load(temperatures + row)
        floor = inv_t * 0.0 - float("inf")  # 只有 logit 大于它的词参赛
        go = row >= 0
        if RND == 0:
            if s == 0:
                tl.store(w + 9 * S, 0.0)
        else:  # 先判上一轮的赢家：每一块都算一遍（读的是同样的几个数，结论相同），第 0 块写结果
            undecided = tl.load(w + 9 * S) == 0.0
            m, top, j = merged(w, S, (RND - 1) % 2, SP)
            j = tl.where(undecided, j, 0.0).to(tl.int32)  # 定下来的行，这一轮的字段没写过
            xj = tl.load(base + j).to(tl.float32)
            min_p = tl.where(HAS_MIN_P != 0, tl.load(min_ps + row), 0.0)
            ok = checked(w, S, SP, xj, m, inv_t, tl.load(top_ks + row), tl.load(top_ps + row), min_p)
            if undecided & ok & (s == 0):
                tl.store(out + row, j)
                tl.store(w + 9 * S, 1.0)
            go = undecided & ~ok
            floor = xj  # 没收下：这一轮只让比它大的词参赛
        if go:
            best, j, m, top = race_pass(base, tl.load(keys + row), lo, hi, floor, inv_t, RND, V, BLOCK)
            tl.store(w + (2 + 2 * (RND % 2)) * S + s, best)
            tl.store(w + (3 + 2 * (RND % 2)) * S + s, j.to(tl.float32))
            if RND == 0:
                tl.store(w + s, m)
                tl.store(w + S + s, top.to(tl.float32))

    @triton.jit(do_not_specialize=PER_ROW)
    def check_chunk(x_ptr, row_stride, temperatures, top_ks, top_ps, min_ps, out, ws, V, S, RND, HAS_MIN_P,
                    CHUNK: tl.constexpr, BLOCK: tl.constexpr, SP: tl.constexpr):
        row = tl.program_id(0)
        s = tl.program_id(1)
        w = ws + row * 10 * S
        if tl.load(w + 9 * S) == 0.0:
            base = x_ptr + row.to(tl.int64) * row_stride
            m, top, j = merged(w, S, RND % 2, SP)  # 这一轮的赢家
            j = j.to(tl.int32)
            k = tl.load(top_ks + row)  # V：不截
            p = tl.load(top_ps + row)  # 1：不截
            min_p = tl.where(HAS_MIN_P != 0, tl.load(min_ps + row), 0.0)
            if (k < V) | (p < 1.0) | (min_p > 0.0):  # 第二遍：比 j 大的词有几个、概率加起来多少
                lo = s * CHUNK
                xj = tl.load(base + j).to(tl.float32)
                total, above, count = check_pass(base, lo, tl.minimum(lo + CHUNK, V), xj, m,
                                                 1.0 / tl.load(temperatures + row), BLOCK)
                tl.store(w + 6 * S + s, total)
                tl.store(w + 7 * S + s, above)
                tl.store(w + 8 * S + s, count)
            elif s == 0:  # 三个都没开：赢家就是答案，不读第二遍
                tl.store(out + row, j)
                tl.store(w + 9 * S, 1.0)

    @triton.jit(do_not_specialize=["keys"] + PER_ROW)
    def race_finish(x_ptr, row_stride, keys, temperatures, top_ks, top_ps, min_ps, out, ws, V, S, RND, HAS_MIN_P,
                    BLOCK: tl.constexpr, SP: tl.constexpr, MAX_ROUNDS: tl.constexpr):
        row = tl.program_id(0)
        w = ws + row * 10 * S
        if tl.load(w + 9 * S) == 0.0:  # 分块的几轮里还没收下的行：一行一个程序实例，在整行上接着赛
            base = x_ptr + row.to(tl.int64) * row_stride
            key = tl.load(keys + row)
            inv_t = 1.0 / tl.load(temperatures + row)
            k = tl.load(top_ks + row)
            p = tl.load(top_ps + row)
            min_p = tl.where(HAS_MIN_P != 0, tl.load(min_ps + row), 0.0)
            m, top, j = merged(w, S, (RND - 1) % 2, SP)
            j = j.to(tl.int32)
            xj = tl.load(base + j).to(tl.float32)
            rnd = k * 0 + RND
            racing = ~checked(w, S, SP, xj, m, inv_t, k, p, min_p)
            while racing:
                _, j, _, _ = race_pass(base, key, 0, V, xj, inv_t, rnd, V, BLOCK)  # floor = 上一个赢家的 logit
                xj = tl.load(base + j).to(tl.float32)
                total, above, count = check_pass(base, 0, V, xj, m, inv_t, BLOCK)
                accept = keep(total, above, count, xj, m, inv_t, k, p, min_p)
                rnd += 1
                j = tl.where(~accept & (rnd >= MAX_ROUNDS), top, j)
                racing = ~accept & (rnd < MAX_ROUNDS)
            tl.store(out + row, j)

    # 被 kernel 调用的 @triton.jit 函数，Triton 按名字在 kernel 所在模块的全局变量里找（编译和解释器都是）
    globals().update(uniforms=uniforms, race_pass=race_pass, check_pass=check_pass, keep=keep, gather=gather,
                     merged=merged, checked=checked)
    return race_chunk, check_chunk, race_finish


def chunked_rounds(G: int) -> int:
    """G 行开了过滤的采样分块赛几轮，之后还没收下的行交给 race_finish。多一轮是两次 launch（H200 的宿主机上一轮约
    60–80 µs，多半花在 CPU 上发射），一行落到 race_finish 约 0.13 ms；行越多，赛完几轮还剩下的行越多，多赛一轮越划算。
    分界是 H200 上批 1–256 扫出来的。"""
    return 1 if G <= 4 else 2 if G <= 64 else 3


def race_sample_supported() -> bool:
    """有 Triton 就能用（GPU 上；CPU 上只有 Triton 的解释器，TRITON_INTERPRET=1，测试用它逐行执行这些 kernel）。"""
    return _kernels() is not None


def race_sample(x: torch.Tensor, keys: torch.Tensor, temperatures: torch.Tensor, top_k: torch.Tensor,
                top_p: torch.Tensor, min_p: torch.Tensor | None, *, rounds: int | None = None,
                chunk: int = CHUNK) -> torch.Tensor:
    """x: [G, V] logits（bf16 或 float32，行内连续；−inf 的词抽不到）；keys: [G] int64 随机数种子；temperatures、
    top_p、min_p: [G] float32（min_p 整组没开时为 None）；top_k: [G] int64（V 表示不截）→ [G] int32。
    rounds（分块赛几轮，默认 chunked_rounds(G)；整组都没开过滤时给 1：赢家第一轮就定下）和 chunk（一块几个词）
    不改变抽到的词，只改变快慢；测试用它们把两条路都走到。"""
    G, V = x.shape
    assert x.stride(1) == 1 and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1") and V < 2**24
    race_chunk, check_chunk, race_finish = _kernels()
    block = max(16, min(BLOCK, chunk, 1 << (V - 1).bit_length()))
    chunk = max(1, min(chunk // block, -(-V // block))) * block  # 整数段，不超过一行
    S = -(-V // chunk)
    rounds = max(1, chunked_rounds(G) if rounds is None else rounds)
    out = torch.empty(G, dtype=torch.int32, device=x.device)
    ws = torch.zeros(G, 10, S, device=x.device)  # 定下来的行之后几轮的字段不写，也照样被读（结果不用）：不能是 NaN
    args = (temperatures, top_k, top_p, top_p if min_p is None else min_p, out, ws, V, S)
    meta = dict(BLOCK=block, SP=1 << (S - 1).bit_length(), num_warps=NUM_WARPS)
    has_min_p = int(min_p is not None)
    for r in range(rounds):
        race_chunk[(G, S)](x, x.stride(0), keys, *args, r, has_min_p, CHUNK=chunk, **meta)
        check_chunk[(G, S)](x, x.stride(0), *args, r, has_min_p, CHUNK=chunk, **meta)
    race_finish[(G,)](x, x.stride(0), keys, *args, rounds, has_min_p, MAX_ROUNDS=MAX_ROUNDS, **meta)
    return out


def warm_race_sample(vocab_size: int, dtype: torch.dtype, device: torch.device) -> None:
    """在 [1, V] 的假 logits 上跑一次 race_sample：Triton 在这时编译三个 kernel（dtype 每种一份；
    之后从磁盘上的缓存读），不让第一个带 seed 的请求等。"""
    one = torch.ones(1, device=device)
    race_sample(torch.zeros(1, vocab_size, dtype=dtype, device=device), torch.zeros(1, dtype=torch.int64, device=device),
                one, torch.full((1,), vocab_size, dtype=torch.int64, device=device), one * 0.9, None)
