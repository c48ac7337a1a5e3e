# Tangled from book/chapters/ch07_prefix_cache.ipynb — edit the notebook, not this file.
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Callable, Dict, Hashable, List, Tuple

import torch

from minisgl.utils import align_down

from .base import BaseCacheHandle, BasePrefixCache, InsertResult, MatchResult, SizeInfo

# L = 一个节点的 token 数（page_size 的整数倍）；N = 输入的 token 数


class RadixTreeNode:
    """树上的一段 token：key 是这些 token（CPU），value 是它们的槽（缓存的 device）。根的 key 为空。"""

    def __init__(self, key: torch.Tensor, value: torch.Tensor, parent: RadixTreeNode | None,
                 timestamp: int) -> None:
        self.key = key  # [L] int32 CPU
        self.value = value  # [L] int32
        self.parent = parent  # 被淘汰后置为 None
        self.children: Dict[Hashable, RadixTreeNode] = {}  # 孩子按第一个 token 登记（整页时按第一页）
        self.ref_count = 0  # 有几个句柄锁着这个节点（锁住后代也算）
        self.timestamp = timestamp  # 最近一次被匹配或插入的时刻：LRU 淘汰看它

    @property
    def length(self) -> int:
        return len(self.key)

    def is_leaf(self) -> bool:
        return not self.children


@dataclass(frozen=True)
class RadixCacheHandle(BaseCacheHandle):
    node: RadixTreeNode  # 从根走到 node 恰好 cached_len 个 token


def compare_key(key: torch.Tensor, input_ids: torch.Tensor) -> int:
    """两个 1-D 整数张量从头有几个相同：第一个不同的位置；全都相同时是较短者的长度。"""
    n = min(len(key), len(input_ids))
    diff = (key[:n] != input_ids[:n]).nonzero()  # [不同的个数, 1]
    return int(diff[0, 0]) if len(diff) else n


class RadixPrefixCache(BasePrefixCache):
    """基数树前缀缓存：共享的前缀只存一份；引用计数保护运行中的请求；按 LRU 淘汰没被锁住的叶子。"""

    def __init__(self, device: torch.device, page_size: int = 1) -> None:
        super().__init__(device, page_size)
        self._empty = torch.empty(0, dtype=torch.int32, device=device)
        self._clock = 0  # 逻辑时钟：每次匹配、插入加一
        self.reset()

    def reset(self) -> None:
        self._root = RadixTreeNode(torch.empty(0, dtype=torch.int32), self._empty, None, 0)
        self._evictable_size = 0
        self._protected_size = 0

    def match_prefix(self, input_ids: torch.Tensor) -> MatchResult:
        node, prefix_len = self._walk(input_ids)
        values: List[torch.Tensor] = []
        n = node
        while n is not self._root:
            values.append(n.value)
            n = n.parent
        indices = torch.cat(values[::-1]) if values else self._empty  # [prefix_len]
        return MatchResult(RadixCacheHandle(prefix_len, node), indices)

    def insert_prefix(self, input_ids: torch.Tensor, indices: torch.Tensor) -> InsertResult:
        if len(input_ids) != len(indices):
            raise ValueError(f"insert_prefix: {len(input_ids)} token ids but {len(indices)} slot indices")
        insert_len = align_down(len(input_ids), self.page_size)  # 只收整页
        node, prefix_len = self._walk(input_ids[:insert_len])
        if prefix_len < insert_len:  # 没缓存过的部分挂成一个新叶子
            leaf = RadixTreeNode(input_ids[prefix_len:insert_len].clone(),
                                 indices[prefix_len:insert_len].clone(), node, self._clock)
            node.children[self._child_key(leaf.key)] = leaf
            self._evictable_size += leaf.length
            node = leaf
        return InsertResult(prefix_len, RadixCacheHandle(insert_len, node))

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        assert isinstance(handle, RadixCacheHandle), f"not a radix cache handle: {handle}"
        node = handle.node
        while node is not self._root:
            assert node.parent is not None, "the handle points into an evicted part of the tree"
            if unlock:
                assert node.ref_count > 0, f"unlocking a node nobody locked ({node.length} tokens)"
                node.ref_count -= 1
                if node.ref_count == 0:
                    self._protected_size -= node.length
                    self._evictable_size += node.length
            else:
                if node.ref_count == 0:
                    self._evictable_size -= node.length
                    self._protected_size += node.length
                node.ref_count += 1
            node = node.parent

    def evict(self, size: int) -> torch.Tensor:
        if size <= 0:
            return self._empty
        if size > self._evictable_size:
            raise RuntimeError(f"cannot evict {size} tokens: only {self._evictable_size} are evictable, "
                               f"{self._protected_size} are locked by running requests")
        tie = itertools.count()  # 时间戳相同的按入堆的先后
        heap = [(n.timestamp, next(tie), n) for n in self._nodes() if n.is_leaf() and n.ref_count == 0]
        heapq.heapify(heap)
        freed: List[torch.Tensor] = []
        freed_size = 0
        while freed_size < size:
            _, _, node = heapq.heappop(heap)  # 没锁住的节点迟早都会变成叶子，所以堆不会先空
            parent = node.parent
            assert parent is not None and node.ref_count == 0
            del parent.children[self._child_key(node.key)]
            node.parent = None
            freed.append(node.value)
            freed_size += node.length
            self._evictable_size -= node.length
            if parent is not self._root and parent.is_leaf() and parent.ref_count == 0:
                heapq.heappush(heap, (parent.timestamp, next(tie), parent))  # 孩子都走了，父节点成了叶子
        return torch.cat(freed)  # [≥ size] int32

    @property
    def size_info(self) -> SizeInfo:
        return SizeInfo(evictable_size=self._evictable_size, protected_size=self._protected_size)

    def check_integrity(self) -> None:
        P = self.page_size
        sizes = [0, 0]  # 可淘汰、被锁住
        values: List[torch.Tensor] = []
        for node in self._nodes():
            parent = node.parent
            assert parent is not None and parent.children.get(self._child_key(node.key)) is node, "broken link"
            assert node.length > 0 and node.length % P == 0, f"a node of {node.length} tokens ({P=})"
            assert node.value.shape == node.key.shape and node.value.dtype == torch.int32
            assert node.value.device.type == self.device.type, f"slots on {node.value.device}"
            assert node.ref_count >= sum(c.ref_count for c in node.children.values()), "child locked, parent not"
            pages = node.value.view(-1, P)  # [L/P, P]：整页，页内槽连续
            assert (pages[:, 0] % P == 0).all() and (pages - pages[:, :1] == torch.arange(P, device=pages.device)).all()
            sizes[node.ref_count > 0] += node.length
            values.append(node.value)
        assert sizes == [self._evictable_size, self._protected_size], f"{sizes=} vs {self.size_info}"
        slots = torch.cat(values) if values else self._empty
        assert len(torch.unique(slots)) == len(slots), "a KV slot is cached twice"

    def pretty(self, show: Callable[[List[int]], str] = str) -> str:
        """树的文字图，一个节点一行：key（show 把 token 列表变成文字）、长度、引用计数、时间戳、槽。"""
        lines = [f"root  (evictable={self._evictable_size}, protected={self._protected_size})"]

        def walk(node: RadixTreeNode, indent: str) -> None:
            children = sorted(node.children.values(), key=lambda c: c.key.tolist())
            for i, child in enumerate(children):
                last = i == len(children) - 1
                v = child.value.tolist()
                slots = f"{v[0]}..{v[-1]}" if v == list(range(v[0], v[-1] + 1)) else str(v)
                lines.append(f"{indent}{'└─' if last else '├─'} {show(child.key.tolist())}  len={child.length} "
                             f"ref={child.ref_count} t={child.timestamp} slots={slots}")
                walk(child, indent + ("   " if last else "│  "))

        walk(self._root, "")
        return "\n".join(lines)

    def _walk(self, input_ids: torch.Tensor) -> Tuple[RadixTreeNode, int]:
        """沿着 input_ids 已缓存的最长前缀（整页）往下走。停在某个节点中间时先把它切开，所以返回的
        节点恰好覆盖 [0, prefix_len)；路上的节点都记下这次访问的时刻。"""
        self._clock += 1
        node, prefix_len = self._root, 0
        while prefix_len + self.page_size <= len(input_ids):
            rest = input_ids[prefix_len:]  # [N - prefix_len]
            child = node.children.get(self._child_key(rest))
            if child is None:
                break
            match_len = align_down(compare_key(child.key, rest), self.page_size)  # 首页就是键，至少一页
            if match_len < child.length:
                child = self._split(child, match_len)
            child.timestamp = self._clock
            node, prefix_len = child, prefix_len + match_len
        return node, prefix_len

    def _split(self, node: RadixTreeNode, pos: int) -> RadixTreeNode:
        """把 node 切成 [0, pos) 和 [pos, L) 两段，前一段接替 node 在父节点下的位置；返回前一段。"""
        assert 0 < pos < node.length and pos % self.page_size == 0, f"{pos=} {node.length=}"
        parent = node.parent
        assert parent is not None
        head = RadixTreeNode(node.key[:pos], node.value[:pos], parent, node.timestamp)
        head.ref_count = node.ref_count  # 锁着 node 的句柄也锁着这一段：大小统计不变
        parent.children[self._child_key(head.key)] = head  # 和 node 的键相同：直接顶替
        node.key, node.value, node.parent = node.key[pos:], node.value[pos:], head
        head.children[self._child_key(node.key)] = node
        return head

    def _child_key(self, ids: torch.Tensor) -> Hashable:
        """孩子在父节点字典里的键：第一个 token；page_size > 1 时是第一页的 token 元组。"""
        if self.page_size == 1:
            return int(ids[0])
        return tuple(ids[: self.page_size].tolist())

    def _nodes(self) -> List[RadixTreeNode]:
        """除根以外的全部节点。"""
        out: List[RadixTreeNode] = []
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out
