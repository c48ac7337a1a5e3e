# Tangled from book/chapters/ch04_moe.ipynb — edit the notebook, not this file.
from __future__ import annotations

import functools
import os
from typing import Any, Dict, NamedTuple

import torch

from .grouped import BaseMoeBackend

# T = 本批 token 数，H = hidden_size，E = 专家数，K = 每个 token 选几个专家，I = 每个专家的中间维
# P = T·K 个 (token, 专家) 对，第 p 个属于 token p // K；R = 按专家排好、各段补齐到 BM 的倍数之后的行数


@functools.cache
def _kernels() -> Dict[str, Any] | None:
    """第一次用时才 import Triton、定义七个 kernel（下面的 _xxx_kernel）；没有 Triton（CPU 上的安装）时返回 None。"""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None
    return {"route": _route_kernel(triton, tl), "align": _align_kernel(triton, tl),
            "route_align": _route_align_kernel(triton, tl),
            "gate_up": _gate_up_kernel(triton, tl), "down": _down_kernel(triton, tl),
            "pair_gate_up": _pair_gate_up_kernel(triton, tl), "pair_down": _pair_down_kernel(triton, tl)}


def _route_kernel(triton: Any, tl: Any) -> Any:
    @triton.jit
    def route(logits, logit_stride, topk_w, topk_ids, rank, counts, E,
              TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, RENORM: tl.constexpr,
              COUNT: tl.constexpr, RANKS: tl.constexpr):
        t = tl.program_id(0)  # 一个实例 = 一个 token
        e = tl.arange(0, BLOCK_E)
        z = tl.load(logits + t * logit_stride + e, mask=e < E, other=float("-inf")).to(tl.float32)
        p = tl.exp(z - tl.max(z, axis=0))
        p = p / tl.sum(p, axis=0)  # [BLOCK_E] float32 的 softmax；补出来的位置是 0
        j = tl.arange(0, BLOCK_K)
        if RANKS:  # 数名次：概率比 e 大、或一样大而编号更小的专家有几个（[BLOCK_E, BLOCK_E] 的比较矩阵）
            ahead = (p[None, :] > p[:, None]) | ((p[None, :] == p[:, None]) & (e[None, :] < e[:, None]))
            place = tl.sum(ahead.to(tl.int32), axis=1)  # [BLOCK_E]：专家 e 排第几，0 是最大的
            pick = (place[:, None] == j[None, :]) & (j[None, :] < TOP_K)  # [BLOCK_E, BLOCK_K]：e 是不是第 j 名
            ids = tl.sum(tl.where(pick, e[:, None], 0), axis=0)  # [BLOCK_K]：前 K 列每列恰好一个 True，补的列全 0
            w = tl.sum(tl.where(pick, p[:, None], 0.0), axis=0)
        else:  # 专家太多、比较矩阵放不下：K 轮"取最大、划掉"，编译时展开
            w = tl.zeros((BLOCK_K,), dtype=tl.float32)
            ids = tl.zeros((BLOCK_K,), dtype=tl.int32)
            for k in tl.static_range(TOP_K):
                best = tl.argmax(p, axis=0)
                w = tl.where(j == k, tl.max(p, axis=0), w)
                ids = tl.where(j == k, best, ids)
                p = tl.where(e == best, -1.0, p)
        if RENORM:
            w = w / tl.sum(w, axis=0)
        keep = j < TOP_K
        tl.store(topk_w + t * TOP_K + j, w, mask=keep)
        tl.store(topk_ids + t * TOP_K + j, ids, mask=keep)
        if COUNT:  # 给选中的专家各计一行；原子加返回加之前的值，就是这一对在它专家的段里排第几
            tl.store(rank + t * TOP_K + j, tl.atomic_add(counts + ids, 1, mask=keep), mask=keep)

    return route


def _align_kernel(triton: Any, tl: Any) -> Any:
    @triton.jit(do_not_specialize=["P", "num_blocks"])  # 这两个数每批都不同：不为它们各编译一份
    def align(counts, topk_ids, rank, starts, block_expert, sorted_pairs, E, P, num_blocks,
              BM: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr):
        e = tl.arange(0, BLOCK_E)
        n = tl.load(counts + e, mask=e < E, other=0)
        padded = (n + BM - 1) // BM * BM  # 每段补齐到 BM 的倍数：一个块只属于一个专家
        ends = tl.cumsum(padded, axis=0)  # [BLOCK_E]：第 e 段在 ends[e] 行结束
        begins = ends - padded
        if tl.program_id(0) == 0:  # 一个实例写元数据：每段的起点；每块属于哪个专家，-1 是用不上的块
            tl.store(starts + e, begins, mask=e < E)
            for b0 in range(0, num_blocks, CHUNK):
                b = b0 + tl.arange(0, CHUNK)
                owner = tl.sum(((ends[None, :] <= b[:, None] * BM) & (e[None, :] < E)).to(tl.int32), axis=1)
                tl.store(block_expert + b, tl.where(owner < E, owner, -1), mask=b < num_blocks)
        p = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)  # 每个实例放 CHUNK 个对
        ok = p < P
        ex = tl.load(topk_ids + p, mask=ok, other=0)
        first = tl.sum(tl.where(ex[:, None] == e[None, :], begins[None, :], 0), axis=1)  # [CHUNK]：begins[ex]
        tl.store(sorted_pairs + first + tl.load(rank + p, mask=ok, other=0), p, mask=ok)

    return align


def _route_align_kernel(triton: Any, tl: Any) -> Any:
    @triton.jit(do_not_specialize=["T", "num_blocks", "num_arrivals"])
    def route_align(logits, logit_stride, topk_w, topk_ids, counts, starts, block_expert, sorted_pairs, arrivals,
                    T, E, num_blocks, num_arrivals, TOP_K: tl.constexpr, BM: tl.constexpr, BLOCK_T: tl.constexpr,
                    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, RENORM: tl.constexpr):
        t = tl.arange(0, BLOCK_T)  # 只有一个实例：全部 T 个 token 一起做
        e = tl.arange(0, BLOCK_E)
        j = tl.arange(0, BLOCK_K)
        z = tl.load(logits + t[:, None] * logit_stride + e[None, :], mask=(t[:, None] < T) & (e[None, :] < E),
                    other=0.0).to(tl.float32)
        z = tl.where(e[None, :] < E, z, float("-inf"))  # 补出来的专家是 -inf；补出来的 token 读成 0，算了也不用
        p = tl.exp(z - tl.max(z, axis=1)[:, None])
        p = p / tl.sum(p, axis=1)[:, None]  # [BLOCK_T, BLOCK_E]：每行一个 token 的 softmax，与 route 同一个公式
        w = tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.float32)
        ids = tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.int32)
        for k in tl.static_range(TOP_K):  # K 轮"取最大、划掉"（route 的 else 那一支），每轮所有 token 一起
            best = tl.argmax(p, axis=1)  # [BLOCK_T]
            w = tl.where(j[None, :] == k, tl.max(p, axis=1)[:, None], w)
            ids = tl.where(j[None, :] == k, best[:, None], ids)
            p = tl.where(e[None, :] == best[:, None], -1.0, p)
        if RENORM:
            w = w / tl.sum(w, axis=1)[:, None]
        keep = (t[:, None] < T) & (j[None, :] < TOP_K)
        pair = t[:, None] * TOP_K + j[None, :]  # [BLOCK_T, BLOCK_K]：对的编号 p = t·K + k
        tl.store(topk_w + pair, w, mask=keep)
        tl.store(topk_ids + pair, ids, mask=keep)
        # 摊平成一排 Q = BLOCK_T·BLOCK_K 个对，先 token 后 k，和编号 p 同序；补出来的位置专家记 -1
        ex = tl.reshape(tl.where(keep, ids, -1), (BLOCK_T * BLOCK_K,))
        pq = tl.reshape(pair, (BLOCK_T * BLOCK_K,))
        hit = ex[:, None] == e[None, :]  # [Q, BLOCK_E]：第 q 个对选没选专家 e
        n = tl.sum(hit.to(tl.int32), axis=0)  # [BLOCK_E]：每个专家几行，数出来的，不是加出来的
        padded = (n + BM - 1) // BM * BM
        ends = tl.cumsum(padded, axis=0)
        begins = ends - padded
        tl.store(counts + e, n, mask=e < E)
        tl.store(starts + e, begins, mask=e < E)
        for b0 in range(0, num_blocks, CHUNK):  # 每块的专家：和 align 的 0 号实例一样
            b = b0 + tl.arange(0, CHUNK)
            owner = tl.sum(((ends[None, :] <= b[:, None] * BM) & (e[None, :] < E)).to(tl.int32), axis=1)
            tl.store(block_expert + b, tl.where(owner < E, owner, -1), mask=b < num_blocks)
        # 名次：同一个专家、编号更小的对有几个（[Q, Q] 的比较矩阵）；每段里的行按对的编号从小到大
        rank = tl.sum(((ex[:, None] == ex[None, :]) & (pq[None, :] < pq[:, None])).to(tl.int32), axis=1)
        first = tl.sum(tl.where(hit, begins[None, :], 0), axis=1)  # [Q]：begins[ex]
        tl.store(sorted_pairs + first + rank, pq, mask=ex >= 0)
        for a0 in range(0, num_arrivals, CHUNK):  # down 收尾用的到齐计数器，清零（见 down）
            a = a0 + tl.arange(0, CHUNK)
            tl.store(arrivals + a, tl.zeros((CHUNK,), dtype=tl.int32), mask=a < num_arrivals)

    return route_align


class Routing(NamedTuple):
    """路由和排序的结果，两个矩阵乘只读这些。"""

    topk_w: torch.Tensor  # [T, K] float32：每个对的路由权重
    topk_ids: torch.Tensor  # [T, K] int32：每个对的专家
    counts: torch.Tensor  # [E]：每个专家分到几行
    starts: torch.Tensor  # [E]：第 e 段从第几行开始
    block_expert: torch.Tensor  # [num_blocks]：每块的专家，-1 是空块
    sorted_pairs: torch.Tensor  # [R]：每行是哪个对；段尾补齐的行没写过
    arrivals: torch.Tensor  # [T·slots]：全是 0，down 收尾时每个 (token, 列块) 一个到齐计数器


ONE_PROGRAM_TILE = 8192  # route_align 的两个比较矩阵 [Q, Q]、[Q, E] 最多这么多个元素
RANK_MAX_E = 128  # route 用 [BLOCK_E, BLOCK_E] 的比较矩阵数名次的上限；专家更多时 K 轮取最大


def one_program_routing(num_tokens: int, num_experts: int, top_k: int) -> bool:
    """路由和排序能不能由一个实例做完：Q = T·K（两者各补成 2 的幂）个对，比较矩阵不超过 ONE_PROGRAM_TILE。"""
    q = _pow2(num_tokens, 1) * _pow2(top_k, 1)
    return q * max(q, _pow2(num_experts, 1)) <= ONE_PROGRAM_TILE


def launch_route(router_logits: torch.Tensor, topk_w: torch.Tensor, topk_ids: torch.Tensor, top_k: int,
                 renormalize: bool, rank: torch.Tensor | None = None, counts: torch.Tensor | None = None) -> None:
    """route，每个 token 一个实例：写 topk_w、topk_ids [T, K]；给了 rank、counts 时再原子加计数（排序要用）。
    块大小和 top-k 的两种写法都只由 E、K 定，在这一处选。"""
    T, E = router_logits.shape
    block_e, count = _pow2(E, 1), rank is not None
    _kernels()["route"][(T,)](router_logits, router_logits.stride(0), topk_w, topk_ids,
                              rank if count else topk_ids, counts if count else topk_ids, E,  # 不计数时占个位，不碰
                              TOP_K=top_k, BLOCK_E=block_e, BLOCK_K=_pow2(top_k, 1), RENORM=renormalize,
                              COUNT=count, RANKS=block_e <= RANK_MAX_E)


def route_and_align(router_logits: torch.Tensor, top_k: int, renormalize: bool, bm: int,
                    one_program: bool | None = None, slots: int = 0) -> Routing:
    """router_logits [T, E] → Routing：各段补齐到 bm 行。one_program：None 时按 one_program_routing 选；
    slots：每个 token 几个到齐计数器（down 收尾时的列块数；0：不要）。"""
    k = _kernels()
    T, E = router_logits.shape
    P, dev = T * top_k, router_logits.device
    block_t, block_e, block_k = _pow2(T, 1), _pow2(E, 1), _pow2(top_k, 1)
    # 块数取上界（每个有活的专家至多多出一个不满的块），于是形状与路由的结果无关
    num_blocks = -(-P // bm) + min(E, P)
    chunk = min(1024, max(16, 4096 // block_e))  # 一次放 chunk 个对、看 chunk 个块（[chunk, E] 的比较矩阵）
    if one_program is None:
        one_program = one_program_routing(T, E, top_k)
    ints = functools.partial(torch.empty, dtype=torch.int32, device=dev)
    # counts 和到齐计数器在同一块显存：小批时 route_align 写 counts、清计数器；大批时 counts 要从 0 加起（route
    # 原子加），计数器也要是 0，一次 memset
    counters = (torch.empty if one_program else torch.zeros)(E + T * slots, dtype=torch.int32, device=dev)
    r = Routing(torch.empty(T, top_k, dtype=torch.float32, device=dev), ints(T, top_k), counters[:E], ints(E),
                ints(num_blocks), ints(num_blocks * bm), counters[E:])
    if one_program:  # 小批：一个 kernel
        q = block_t * block_k  # 一排有几个对
        k["route_align"][(1,)](router_logits, router_logits.stride(0), *r, T, E, num_blocks, T * slots,
                               TOP_K=top_k, BM=bm, BLOCK_T=block_t, BLOCK_E=block_e, BLOCK_K=block_k,
                               CHUNK=chunk, RENORM=renormalize, num_warps=1 if q <= 16 else 4 if q <= 32 else 8)
        return r
    # 大批：route（每个 token 一个实例，原子加计数）、align（每个实例放 chunk 个对）
    rank = torch.empty(T, top_k, dtype=torch.int32, device=dev)  # [T, K]：在自己专家的段里排第几
    launch_route(router_logits, r.topk_w, r.topk_ids, top_k, renormalize, rank, r.counts)
    k["align"][(-(-P // chunk),)](r.counts, r.topk_ids, rank, r.starts, r.block_expert, r.sorted_pairs, E, P,
                                  num_blocks, BM=bm, BLOCK_E=block_e, CHUNK=chunk)
    return r


def _gate_up_kernel(triton: Any, tl: Any) -> Any:
    @triton.jit
    def gate_up(x, x_stride, w, sorted_pairs, block_expert, starts, counts, out, I, H,
                TOP_K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                EVEN_K: tl.constexpr, IEEE: tl.constexpr):
        e = tl.load(block_expert + tl.program_id(1))  # 这一块的专家
        if e < 0:
            return
        rows = tl.program_id(1) * BM + tl.arange(0, BM)
        valid = rows < tl.load(starts + e) + tl.load(counts + e)  # 段尾补齐的行不算
        pairs = tl.load(sorted_pairs + rows, mask=valid, other=0)  # 每行是哪个 (token, 专家) 对
        n = tl.program_id(0) * BN + tl.arange(0, BN)  # 这个实例算的 BN 列（gate 和 up 各 BN 列）
        k = tl.arange(0, BK)
        a_ptrs = x + (pairs // TOP_K).to(tl.int64)[:, None] * x_stride + k[None, :]  # [BM, BK]：各行的 token
        g_ptrs = w + e.to(tl.int64) * 2 * I * H + n[None, :] * H + k[:, None]  # [BK, BN]：gate 的 BN 行，转置着读
        u_ptrs = g_ptrs + I * H  # up 在 gate 下面 I 行
        acc_g = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, H, BK):
            if EVEN_K:
                a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
                g = tl.load(g_ptrs, mask=n[None, :] < I, other=0.0)
                u = tl.load(u_ptrs, mask=n[None, :] < I, other=0.0)
            else:
                a = tl.load(a_ptrs, mask=valid[:, None] & (k[None, :] < H - k0), other=0.0)
                g = tl.load(g_ptrs, mask=(k[:, None] < H - k0) & (n[None, :] < I), other=0.0)
                u = tl.load(u_ptrs, mask=(k[:, None] < H - k0) & (n[None, :] < I), other=0.0)
            if IEEE:  # float32 的模型：真正的 float32 乘法（tl.dot 默认用 TF32）
                acc_g = tl.dot(a, g, acc_g, input_precision="ieee")
                acc_u = tl.dot(a, u, acc_u, input_precision="ieee")
            else:
                acc_g = tl.dot(a, g, acc_g)
                acc_u = tl.dot(a, u, acc_u)
            a_ptrs += BK
            g_ptrs += BK
            u_ptrs += BK
        h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u  # SiLU(gate)·up，在 float32 里算完才舍入
        tl.store(out + rows.to(tl.int64)[:, None] * I + n[None, :], h.to(out.dtype.element_ty),
                 mask=valid[:, None] & (n[None, :] < I))

    return gate_up


def _down_kernel(triton: Any, tl: Any) -> Any:
    @triton.jit
    def down(h, w, sorted_pairs, block_expert, starts, counts, topk_w, rows_out, arrivals, out, H, I,
             TOP_K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
             IEEE: tl.constexpr, SUM: tl.constexpr):
        e = tl.load(block_expert + tl.program_id(1))
        if e < 0:
            return
        rows = tl.program_id(1) * BM + tl.arange(0, BM)
        valid = rows < tl.load(starts + e) + tl.load(counts + e)
        pairs = tl.load(sorted_pairs + rows, mask=valid, other=0)
        n = tl.program_id(0) * BN + tl.arange(0, BN)
        k = tl.arange(0, BK)
        a_ptrs = h + rows.to(tl.int64)[:, None] * I + k[None, :]  # [BM, BK]：排好序的行，连续地读
        w_ptrs = w + e.to(tl.int64) * H * I + n[None, :] * I + k[:, None]  # [BK, BN]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, I, BK):
            if EVEN_K:
                a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
                b = tl.load(w_ptrs, mask=n[None, :] < H, other=0.0)
            else:
                a = tl.load(a_ptrs, mask=valid[:, None] & (k[None, :] < I - k0), other=0.0)
                b = tl.load(w_ptrs, mask=(k[:, None] < I - k0) & (n[None, :] < H), other=0.0)
            if IEEE:
                acc = tl.dot(a, b, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
            a_ptrs += BK
            w_ptrs += BK
        acc = acc * tl.load(topk_w + pairs, mask=valid, other=0.0)[:, None]  # 乘这一对的路由权重（float32）
        cols = n[None, :] < H
        tl.store(rows_out + pairs.to(tl.int64)[:, None] * H + n[None, :], acc.to(rows_out.dtype.element_ty),
                 mask=valid[:, None] & cols)  # 写到第 p 行：(token, 专家) 对的原顺序
        if SUM:  # 收尾：token t 的 K 行在 K 个块里，由 K 个实例写出。写完的实例给 (t, 本列块) 的计数器加一；
            # 加之前已经是 K-1 的那个最后到，由它按 k = 0..K-1 的顺序把 K 行加起来
            tl.debug_barrier()  # 本实例的线程都写完了，才去报到
            tokens = pairs // TOP_K
            seen = tl.atomic_add(arrivals + tokens * tl.num_programs(0) + tl.program_id(0), 1, mask=valid,
                                 sem="acq_rel", scope="gpu")  # [BM]：报到之前已经到了几个
            last = valid & (seen == TOP_K - 1)
            tl.debug_barrier()  # 报到的结果交给读行的线程：它们在这之后才读
            total = tl.zeros((BM, BN), dtype=tl.float32)
            for j in tl.static_range(TOP_K):
                row = (tokens * TOP_K + j).to(tl.int64)  # token t 的第 j 行
                total += tl.load(rows_out + row[:, None] * H + n[None, :], mask=last[:, None] & cols, other=0.0,
                                 cache_modifier=".cg").to(tl.float32)  # .cg：从 L2 读，别的 SM 刚写的行在那里
            tl.store(out + tokens.to(tl.int64)[:, None] * H + n[None, :], total.to(out.dtype.element_ty),
                     mask=last[:, None] & cols)

    return down


def _pair_gate_up_kernel(triton: Any, tl: Any) -> Any:
    @triton.jit
    def pair_gate_up(x, x_stride, w, topk_ids, out, I, H,
                     TOP_K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr):
        p = tl.program_id(1)  # 一个实例 = 一个 (token, 专家) 对 × gate、up 各 BN 行
        e = tl.load(topk_ids + p).to(tl.int64)
        n = tl.program_id(0) * BN + tl.arange(0, BN)
        k = tl.arange(0, BK)
        x_ptrs = x + (p // TOP_K).to(tl.int64) * x_stride + k  # [BK]：这一对的 token
        g_ptrs = w + e * 2 * I * H + n[:, None] * H + k[None, :]  # [BN, BK]：gate 的 BN 行，按行读
        u_ptrs = g_ptrs + I * H
        acc_g = tl.zeros((BN, BK), dtype=tl.float32)  # 逐元素乘加，K 方向最后才求和
        acc_u = tl.zeros((BN, BK), dtype=tl.float32)
        for k0 in range(0, H, BK):
            if EVEN_K:
                a = tl.load(x_ptrs).to(tl.float32)
                g = tl.load(g_ptrs, mask=n[:, None] < I, other=0.0).to(tl.float32)
                u = tl.load(u_ptrs, mask=n[:, None] < I, other=0.0).to(tl.float32)
            else:
                a = tl.load(x_ptrs, mask=k < H - k0, other=0.0).to(tl.float32)
                g = tl.load(g_ptrs, mask=(n[:, None] < I) & (k[None, :] < H - k0), other=0.0).to(tl.float32)
                u = tl.load(u_ptrs, mask=(n[:, None] < I) & (k[None, :] < H - k0), other=0.0).to(tl.float32)
            acc_g += a[None, :] * g
            acc_u += a[None, :] * u
            x_ptrs += BK
            g_ptrs += BK
            u_ptrs += BK
        gate = tl.sum(acc_g, axis=1)  # [BN]
        h = gate / (1.0 + tl.exp(-gate)) * tl.sum(acc_u, axis=1)
        tl.store(out + p.to(tl.int64) * I + n, h.to(out.dtype.element_ty), mask=n < I)

    return pair_gate_up


def _pair_down_kernel(triton: Any, tl: Any) -> Any:
    @triton.jit
    def pair_down(h, w, topk_ids, topk_w, out, H, I, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr,
                  BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr):
        t = tl.program_id(1)  # 一个实例 = 一个 token 的 BN 列，它的 K 个专家一起算
        n = tl.program_id(0) * BN + tl.arange(0, BN)
        j = tl.arange(0, BLOCK_K)  # 第几个专家（补成 2 的幂，多出来的不读）
        keep = j < TOP_K
        e = tl.load(topk_ids + t * TOP_K + j, mask=keep, other=0).to(tl.int64)  # [BLOCK_K]
        k = tl.arange(0, BK)
        a_ptrs = h + (t * TOP_K + j).to(tl.int64)[:, None, None] * I + k[None, None, :]  # [BLOCK_K, 1, BK]：h 的 K 行
        w_ptrs = w + e[:, None, None] * H * I + n[None, :, None] * I + k[None, None, :]  # [BLOCK_K, BN, BK]
        rows_ok = keep[:, None, None] & (n[None, :, None] < H)
        acc = tl.zeros((BLOCK_K, BN, BK), dtype=tl.float32)
        for k0 in range(0, I, BK):
            if EVEN_K:
                a = tl.load(a_ptrs, mask=keep[:, None, None], other=0.0).to(tl.float32)
                b = tl.load(w_ptrs, mask=rows_ok, other=0.0).to(tl.float32)
            else:
                a = tl.load(a_ptrs, mask=keep[:, None, None] & (k[None, None, :] < I - k0), other=0.0).to(tl.float32)
                b = tl.load(w_ptrs, mask=rows_ok & (k[None, None, :] < I - k0), other=0.0).to(tl.float32)
            acc += a * b
            a_ptrs += BK
            w_ptrs += BK
        weight = tl.load(topk_w + t * TOP_K + j, mask=keep, other=0.0)  # [BLOCK_K] float32 的路由权重
        # 每行先乘权重、舍入成模型的 dtype，和 down 写出的行一样；再沿 k 加起来
        rows = (tl.sum(acc, axis=2) * weight[:, None]).to(out.dtype.element_ty).to(tl.float32)  # [BLOCK_K, BN]
        tl.store(out + t.to(tl.int64) * H + n, tl.sum(rows, axis=0).to(out.dtype.element_ty), mask=n < H)

    return pair_down


class Blocks(NamedTuple):
    """分块：bm 是一块的行数（各专家的段补齐到它的倍数）；两个矩阵乘各自的列宽、K 方向的步长和 Triton 的启动参数。"""

    bm: int
    bn_gate_up: int
    bn_down: int
    bk: int
    num_warps: int
    num_stages: int
    fuse_sum: bool = True  # 沿 k 的求和放进 down 的收尾（小批），还是另起一个求和的 kernel（大批）
    pairs: bool = False  # 一个对一个实例（pair_gate_up、pair_down），不排序；bn_* 是一个实例算几行权重


PAIR_ROWS = 0.25  # 每个专家平均至多这么多行时一个对一个实例（Qwen3-30B-A3B：T ≤ 4）


def choose_blocks(num_pairs: int, num_experts: int, dtype: torch.dtype, pairs: bool | None = None) -> Blocks:
    """看每个专家平均分到几行：decode 时一两行，读权重为主，块要矮；prefill 时成百上千行，是真正的矩阵乘。
    pairs：None 时按 PAIR_ROWS 选；False 时只在分块的几档里选（测试和基准拿它与一个对一个实例比）。"""
    rows = num_pairs / num_experts
    if pairs or (pairs is None and rows <= PAIR_ROWS):
        return Blocks(1, 1, 1, 1024, 4, 1, pairs=True)
    if rows <= 16:
        blocks = Blocks(16, 32, 64, 128, 4, 4)
    elif rows <= 64:
        blocks = Blocks(32, 64, 64, 64, 4, 4, fuse_sum=False)
    elif rows <= 256:
        blocks = Blocks(64, 64, 128, 64, 4, 3, fuse_sum=False)
    else:
        blocks = Blocks(128, 64, 128, 64, 8, 3, fuse_sum=False)
    if dtype == torch.float32:  # 每个元素 4 字节：流水线少两级，共享内存才放得下
        blocks = blocks._replace(num_stages=2)
    return blocks


def fused_moe(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, router_logits: torch.Tensor,
              top_k: int, renormalize: bool, blocks: Blocks | None = None,
              one_program: bool | None = None) -> torch.Tensor:
    """与 GroupedMoe.forward 相同的计算：x [T, H]，gate_up [E, 2I, H]，down [E, H, I]，router_logits [T, E] → [T, H]。

    T 小时三个 kernel（route_align、gate_up、down，求和在 down 的收尾里）；T 大时路由换成清零、route、align 三个，
    每个专家平均超过 16 行时求和再另起一个 kernel。每个张量的形状只取决于 T，没有一处把数据拷回 CPU。
    blocks：None 时按 choose_blocks；one_program：None 时按 one_program_routing 选。
    """
    k = _kernels()
    (T, H), (E, _, I) = x.shape, down.shape
    P, dev = T * top_k, x.device
    b = blocks or choose_blocks(P, E, x.dtype)
    if b.pairs:
        return fused_moe_pairs(x, gate_up, down, router_logits, top_k, renormalize, b)
    bn_down = min(b.bn_down, _pow2(H))
    slots = -(-H // bn_down) if b.fuse_sum else 0  # down 收尾用的计数器：每个 token 每个列块一个
    # 1–2. 路由与排序（连同清零计数器）：小批一个实例做完，大批 route + align
    r = route_and_align(router_logits, top_k, renormalize, b.bm, one_program, slots)
    num_blocks = r.block_expert.shape[0]
    # 3. gate_up 与 SiLU·up：一块 BM 行 × BN 列一个实例，按排好的行写
    launch = dict(IEEE=x.dtype == torch.float32, num_warps=b.num_warps, num_stages=b.num_stages)
    h = torch.empty(num_blocks * b.bm, I, dtype=x.dtype, device=dev)  # [R, I]
    bn, bk = min(b.bn_gate_up, _pow2(I)), min(b.bk, _pow2(H))
    k["gate_up"][(-(-I // bn), num_blocks)](x, x.stride(0), gate_up, r.sorted_pairs, r.block_expert, r.starts,
                                            r.counts, h, I, H, TOP_K=top_k, BM=b.bm, BN=bn, BK=bk,
                                            EVEN_K=H % bk == 0, **launch)
    # 4. down，乘路由权重，按 (token, 专家) 对的顺序写出各行；fuse_sum 时每个 token 最后到的实例把它的 K 行相加
    rows = torch.empty(P, H, dtype=x.dtype, device=dev)  # [P, H]
    out = torch.empty(T, H, dtype=x.dtype, device=dev) if b.fuse_sum else rows  # [T, H]；不收尾时用不上，占个位
    bk = min(b.bk, _pow2(I))
    k["down"][(-(-H // bn_down), num_blocks)](h, down, r.sorted_pairs, r.block_expert, r.starts, r.counts,
                                              r.topk_w, rows, r.arrivals, out, H, I, TOP_K=top_k, BM=b.bm,
                                              BN=bn_down, BK=bk, EVEN_K=I % bk == 0, SUM=b.fuse_sum, **launch)
    # 5. 大批：每个 token 的 K 行由一个求和的 kernel 按 k 的顺序相加
    return out if b.fuse_sum else rows.view(T, top_k, H).sum(dim=1)  # [T, H]


def fused_moe_pairs(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, router_logits: torch.Tensor,
                    top_k: int, renormalize: bool, b: Blocks) -> torch.Tensor:
    """一个对一个实例（b.pairs）：route（不计数）、pair_gate_up、pair_down，三个 kernel，不排序、不补齐。"""
    k = _kernels()
    (T, H), (_, _, I) = x.shape, down.shape
    dev = x.device
    topk_w = torch.empty(T, top_k, dtype=torch.float32, device=dev)
    topk_ids = torch.empty(T, top_k, dtype=torch.int32, device=dev)
    block_k = _pow2(top_k, 1)
    launch_route(router_logits, topk_w, topk_ids, top_k, renormalize)  # 不计数：不排序，用不上名次和计数
    launch = dict(num_warps=b.num_warps, num_stages=b.num_stages)
    h = torch.empty(T * top_k, I, dtype=x.dtype, device=dev)  # [P, I]：第 p 行是第 p 个对
    bn, bk = min(b.bn_gate_up, _pow2(I, 1)), min(b.bk, _pow2(H))
    k["pair_gate_up"][(-(-I // bn), T * top_k)](x, x.stride(0), gate_up, topk_ids, h, I, H, TOP_K=top_k, BN=bn,
                                                BK=bk, EVEN_K=H % bk == 0, **launch)
    out = torch.empty(T, H, dtype=x.dtype, device=dev)  # [T, H]
    # pair_down 一步读 [K, BN, BK] 个权重：BK 取 bk / K，和 pair_gate_up 一步读的 gate 块 [BN, bk] 一样大
    bn, bk = min(b.bn_down, _pow2(H, 1)), min(max(16, b.bk // block_k), _pow2(I))
    k["pair_down"][(-(-H // bn), T)](h, down, topk_ids, topk_w, out, H, I, TOP_K=top_k, BLOCK_K=block_k, BN=bn,
                                     BK=bk, EVEN_K=I % bk == 0, **launch)
    return out


def _pow2(n: int, lo: int = 16) -> int:
    """不小于 n 的 2 的幂，至少 lo（tl.arange 的长度要是 2 的幂，tl.dot 的每一维至少 16）。"""
    return max(lo, 1 << (n - 1).bit_length())


class TritonMoe(BaseMoeBackend):
    """GPU 上的 MoE：fused_moe 的几个 Triton kernel。没有 GPU→CPU 同步，能录进 CUDA Graph；任何 dtype 都行。"""

    supports_cuda_graph = True

    def __init__(self) -> None:
        if _kernels() is None:
            raise RuntimeError("the triton MoE backend needs Triton (pip install triton); on a CPU use "
                               "--moe-backend torch")

    def forward(self, x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                router_logits: torch.Tensor, top_k: int, renormalize: bool) -> torch.Tensor:
        if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":  # 解释器：测试在 CPU 上逐行执行 kernel
            raise ValueError(f"the triton MoE backend runs on CUDA tensors, got {x.device}; use --moe-backend torch")
        assert gate_up.is_contiguous() and down.is_contiguous() and x.stride(1) == router_logits.stride(1) == 1
        return fused_moe(x, gate_up, down, router_logits, top_k, renormalize)


def fused_moe_available() -> bool:
    """这台机器能不能用 fused_moe（装了 Triton）。"""
    return _kernels() is not None
