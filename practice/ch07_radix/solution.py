"""第 7 章练习：基数树（参考答案）。"""
from __future__ import annotations

import heapq
from typing import Dict, List, Tuple


class _Node:
    def __init__(self, key: List[int], values: List[int], parent: "_Node | None", tick: int) -> None:
        self.key = key
        self.values = values
        self.parent = parent
        self.children: Dict[int, _Node] = {}
        self.last_used = tick


class RadixTree:
    """token 序列 → 每个 token 的值（KV 槽号）。共享前缀只存一份。"""

    def __init__(self) -> None:
        self.root = _Node([], [], None, 0)
        self.clock = 0

    def _walk(self, tokens: List[int]) -> Tuple[_Node, int]:
        self.clock += 1
        node, pos = self.root, 0
        while pos < len(tokens) and tokens[pos] in node.children:
            child = node.children[tokens[pos]]
            n = 0
            while n < len(child.key) and pos + n < len(tokens) and child.key[n] == tokens[pos + n]:
                n += 1
            if n < len(child.key):
                child = self._split(child, n)
            child.last_used = self.clock
            node, pos = child, pos + n
        return node, pos

    def _split(self, node: _Node, at: int) -> _Node:
        parent = node.parent
        assert parent is not None and 0 < at < len(node.key)
        head = _Node(node.key[:at], node.values[:at], parent, node.last_used)
        parent.children[head.key[0]] = head
        node.key, node.values, node.parent = node.key[at:], node.values[at:], head
        head.children[node.key[0]] = node
        return head

    def match(self, tokens: List[int]) -> List[int]:
        node, _ = self._walk(tokens)
        out: List[List[int]] = []
        while node is not self.root:
            out.append(node.values)
            node = node.parent
        return [v for values in reversed(out) for v in values]

    def insert(self, tokens: List[int], values: List[int]) -> int:
        if len(tokens) != len(values):
            raise ValueError(f"{len(tokens)} tokens but {len(values)} values")
        node, pos = self._walk(tokens)
        if pos < len(tokens):
            leaf = _Node(list(tokens[pos:]), list(values[pos:]), node, self.clock)
            node.children[tokens[pos]] = leaf
        return pos

    def size(self) -> int:
        return sum(len(n.key) for n in self._nodes())

    def edges(self) -> List[List[int]]:
        return sorted(n.key for n in self._nodes())

    def evict(self, n: int) -> List[int]:
        if n > self.size():
            raise ValueError(f"cannot evict {n} tokens, the tree holds {self.size()}")
        heap = [(node.last_used, i, node) for i, node in enumerate(self._nodes()) if not node.children]
        heapq.heapify(heap)
        tie = len(heap)
        freed: List[int] = []
        while len(freed) < n:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            del parent.children[node.key[0]]
            freed += node.values
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (parent.last_used, tie, parent))
                tie += 1
        return freed

    def _nodes(self) -> List[_Node]:
        out: List[_Node] = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out
