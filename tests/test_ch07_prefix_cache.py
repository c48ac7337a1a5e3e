# Tangled from book/chapters/ch07_prefix_cache.ipynb — edit the notebook, not this file.
"""第 7 章：基数树与一个显然正确的参考模型在随机操作序列上对拍；切分、LRU、整页、naive 的单元测试。"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Dict, List, Set, Tuple

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from minisgl.kvcache import PREFIX_CACHES, BaseCacheHandle, RadixPrefixCache, SizeInfo, create_prefix_cache
from minisgl.kvcache.radix_cache import compare_key
from minisgl.utils import align_down, div_ceil

CPU = torch.device("cpu")


def ids(*tokens: int) -> torch.Tensor:
    return torch.tensor(tokens, dtype=torch.int32)


def slots(start: int, end: int) -> torch.Tensor:
    return torch.arange(start, end, dtype=torch.int32)


class PagePool:
    """测试用的页分配器：整页分出去、整页收回来，收回重复的页立刻报错。"""

    def __init__(self, num_pages: int, page_size: int) -> None:
        self.num_pages, self.page_size = num_pages, page_size
        self.free: List[int] = list(range(num_pages))

    def alloc(self, num_tokens: int) -> torch.Tensor:
        n = div_ceil(num_tokens, self.page_size)
        assert n <= len(self.free), f"need {n} pages, {len(self.free)} free"
        pages = torch.tensor(self.free[:n], dtype=torch.int32)
        del self.free[:n]
        return (pages[:, None] * self.page_size + torch.arange(self.page_size)).flatten()[:num_tokens].int()

    def release(self, slots: torch.Tensor) -> None:  # 从页边界开始的一段槽位
        pages = (slots[:: self.page_size] // self.page_size).tolist()
        assert not set(pages) & set(self.free), f"pages {pages} freed twice"
        self.free += pages


# 三段"系统提示词"，词表只有 4 个 token：随机序列之间有大量公共前缀
BASES = [[random.Random(b).randrange(4) for _ in range(24)] for b in range(3)]
sequences = st.builds(lambda base, cut, tail: BASES[base][:cut] + tail, st.integers(0, 2), st.integers(0, 24),
                      st.lists(st.integers(0, 3), max_size=10)).filter(len)


@dataclass
class Running:
    ids: List[int]
    handle: BaseCacheHandle  # 开始时匹配到并锁住的前缀
    slots: torch.Tensor  # [len(ids)]：前缀的槽位 + 新分到的槽位


class RadixAgainstModel(RuleBasedStateMachine):
    """随机地开始、结束、中止请求，匹配，淘汰；每一步之后和参考模型逐项对照。

    参考模型 self.model：已缓存的每一页 → 它的槽位，以"从开头到这一页结尾的全部 token"为键。
    """

    def __init__(self, page_size: int) -> None:
        super().__init__()
        self.P = page_size
        self.cache = RadixPrefixCache(CPU, page_size)
        self.pool = PagePool(64 // page_size, page_size)
        self.model: Dict[Tuple[int, ...], List[int]] = {}
        self.running: List[Running] = []

    def expected_match(self, tokens: List[int]) -> List[int]:
        out: List[int] = []
        for end in range(self.P, len(tokens) + 1, self.P):
            page = self.model.get(tuple(tokens[:end]))
            if page is None:
                break
            out += page
        return out

    def locked_pages(self) -> Set[Tuple[int, ...]]:
        return {tuple(r.ids[:end]) for r in self.running for end in range(self.P, r.handle.cached_len + 1, self.P)}

    def match_and_check(self, tokens: List[int]):
        m = self.cache.match_prefix(torch.tensor(tokens, dtype=torch.int32))
        want = self.expected_match(tokens)
        assert m.handle.cached_len == len(want) and m.indices.tolist() == want, (m.indices.tolist(), want)
        return m

    def evict_and_check(self, size: int) -> None:
        freed = self.cache.evict(size)
        assert len(freed) >= size and len(freed) % self.P == 0
        freed_set = set(freed.tolist())
        gone = [key for key, page in self.model.items() if set(page) & freed_set]
        assert all(set(self.model[key]) <= freed_set for key in gone), "a page was evicted in part"
        assert len(gone) * self.P == len(freed), "evicted slots that were not cached"
        assert not set(gone) & self.locked_pages(), "a locked prefix was evicted"
        for key in gone:
            del self.model[key]
        assert all(len(key) == self.P or key[: -self.P] in self.model for key in self.model), "not a leaf"
        self.pool.release(freed)

    @rule(tokens=sequences)
    def start_request(self, tokens: List[int]) -> None:
        m = self.match_and_check(tokens)
        self.cache.lock_handle(m.handle)
        need = len(tokens) - m.handle.cached_len
        short = div_ceil(need, self.P) - len(self.pool.free)
        if short > 0:
            if short * self.P > self.cache.size_info.evictable_size:  # 放不下：像调度器一样让它等着
                self.cache.lock_handle(m.handle, unlock=True)
                return
            self.evict_and_check(short * self.P)
        self.running.append(Running(tokens, m.handle, torch.cat([m.indices, self.pool.alloc(need)])))

    @precondition(lambda self: self.running)
    @rule(data=st.data(), finished=st.booleans())
    def end_request(self, data: st.DataObject, finished: bool) -> None:
        req = self.running.pop(data.draw(st.integers(0, len(self.running) - 1)))
        old = req.handle.cached_len
        if finished:  # 正常结束：插入；中止：什么都不插入
            already = len(self.expected_match(req.ids))  # 运行期间别的请求可能插入了同样的前缀
            r = self.cache.insert_prefix(torch.tensor(req.ids, dtype=torch.int32), req.slots)
            keep = align_down(len(req.ids), self.P)
            assert r.cached_len == already >= old and r.handle.cached_len == keep
            for end in range(already + self.P, keep + 1, self.P):
                self.model[tuple(req.ids[:end])] = req.slots[end - self.P:end].tolist()
            self.pool.release(req.slots[old:already])
            self.pool.release(req.slots[keep:])
        else:
            self.pool.release(req.slots[old:])
        self.cache.lock_handle(req.handle, unlock=True)

    @rule(tokens=sequences)
    def match_only(self, tokens: List[int]) -> None:
        self.match_and_check(tokens)

    @rule(size=st.integers(0, 40))
    def evict(self, size: int) -> None:
        if size > self.cache.size_info.evictable_size:
            with pytest.raises(RuntimeError, match="evictable"):
                self.cache.evict(size)
        else:
            self.evict_and_check(size)

    @invariant()
    def agrees_with_model(self) -> None:
        self.cache.check_integrity()
        locked = len(self.locked_pages()) * self.P
        assert self.cache.size_info == SizeInfo(len(self.model) * self.P - locked, locked)
        in_use = sum(div_ceil(len(r.ids) - r.handle.cached_len, self.P) for r in self.running)
        assert len(self.pool.free) + len(self.model) + in_use == self.pool.num_pages, "pages leaked"

    def teardown(self) -> None:  # 中止所有请求，淘汰一切：树空了，页全回来了
        for req in self.running:
            self.pool.release(req.slots[req.handle.cached_len:])
            self.cache.lock_handle(req.handle, unlock=True)
        self.running = []
        self.evict_and_check(self.cache.size_info.evictable_size)
        assert self.cache.size_info == SizeInfo(0, 0) and not self.model
        assert sorted(self.pool.free) == list(range(self.pool.num_pages))
        assert self.cache.match_prefix(torch.tensor(BASES[0], dtype=torch.int32)).handle.cached_len == 0


@pytest.mark.parametrize("page_size", [1, 4])
def test_radix_cache_against_reference_model(page_size: int) -> None:
    run_state_machine_as_test(lambda: RadixAgainstModel(page_size),
                              settings=settings(max_examples=60, stateful_step_count=40, deadline=None,
                                                derandomize=True, database=None))


def test_insert_splits_a_node_where_sequences_diverge() -> None:
    cache = RadixPrefixCache(CPU)
    assert cache.insert_prefix(ids(1, 2, 3, 4, 5), slots(0, 5)).cached_len == 0
    r = cache.insert_prefix(ids(1, 2, 3, 9, 9), slots(5, 10))
    assert (r.cached_len, r.handle.cached_len) == (3, 5)  # 调用方要释放重复的 5, 6, 7
    head = cache._root.children[1]
    assert list(cache._root.children) == [1] and head.key.tolist() == [1, 2, 3] and head.value.tolist() == [0, 1, 2]
    assert sorted((c.key.tolist(), c.value.tolist()) for c in head.children.values()) == [([4, 5], [3, 4]),
                                                                                          ([9, 9], [8, 9])]
    m = cache.match_prefix(ids(1, 2, 3, 9, 9, 7))
    assert m.handle.cached_len == 5 and m.indices.tolist() == [0, 1, 2, 8, 9]
    cache.check_integrity()


def test_match_splits_inside_a_node_and_the_lock_covers_the_path() -> None:
    cache = RadixPrefixCache(CPU)
    cache.insert_prefix(ids(1, 2, 3, 4, 5, 6), slots(0, 6))
    m = cache.match_prefix(ids(1, 2, 3, 7))
    assert m.handle.cached_len == 3 and m.indices.tolist() == [0, 1, 2]
    cache.lock_handle(m.handle)
    assert cache.size_info == SizeInfo(evictable_size=3, protected_size=3)
    assert cache.evict(1).tolist() == [3, 4, 5]  # 只有没锁住的后半段能走，而且整个节点一起走
    with pytest.raises(RuntimeError, match="locked"):
        cache.evict(1)
    cache.lock_handle(m.handle, unlock=True)
    assert cache.evict(3).tolist() == [0, 1, 2] and cache.size_info == SizeInfo(0, 0)
    cache.check_integrity()


def test_evicts_least_recently_used_leaves_first() -> None:
    cache = RadixPrefixCache(CPU)
    for i, first in enumerate([1, 2, 3]):
        cache.insert_prefix(ids(first, first), slots(2 * i, 2 * i + 2))
    cache.match_prefix(ids(1, 1))  # 最近用过 [1, 1]
    assert cache.evict(1).tolist() == [2, 3]  # [2, 2] 最旧
    assert cache.evict(1).tolist() == [4, 5]
    assert cache.evict(1).tolist() == [0, 1]


def test_a_parent_is_evicted_after_its_children() -> None:
    cache = RadixPrefixCache(CPU)
    cache.insert_prefix(ids(1, 2, 3), slots(0, 3))
    cache.insert_prefix(ids(1, 2, 4), slots(3, 6))  # [1, 2] 下面两个孩子 [3]、[4]
    cache.insert_prefix(ids(7), slots(6, 7))  # 最新的叶子
    assert sorted(cache.evict(3).tolist()) == [0, 1, 2, 5]  # 两个孩子，然后成了叶子的 [1, 2]
    assert cache.match_prefix(ids(7)).indices.tolist() == [6]
    cache.check_integrity()


def test_page_size_keeps_whole_pages_only() -> None:
    cache = RadixPrefixCache(CPU, page_size=4)
    r = cache.insert_prefix(slots(0, 10), slots(100, 110))
    assert (r.cached_len, r.handle.cached_len) == (0, 8) and cache.size_info.evictable_size == 8
    assert list(cache._root.children) == [(0, 1, 2, 3)]
    assert cache.match_prefix(slots(0, 7)).indices.tolist() == [100, 101, 102, 103]
    assert cache.match_prefix(ids(0, 1, 2, 3, 4, 5, 6, 99)).handle.cached_len == 4  # 第二页最后一个不同
    assert cache.match_prefix(ids(0, 1, 2, 99, 4)).handle.cached_len == 0
    assert cache.evict(1).tolist() == [104, 105, 106, 107]  # 要 1 个，还整页
    cache.check_integrity()


def test_naive_cache_never_reuses() -> None:
    cache = create_prefix_cache("naive", CPU)
    r = cache.insert_prefix(ids(1, 2, 3), slots(0, 3))
    assert (r.cached_len, r.handle.cached_len) == (0, 0)  # 一个不收：调用方全部释放
    m = cache.match_prefix(ids(1, 2, 3))
    assert m.handle.cached_len == 0 and len(m.indices) == 0
    cache.lock_handle(m.handle)
    cache.lock_handle(m.handle, unlock=True)
    assert len(cache.evict(0)) == 0 and cache.size_info == SizeInfo(0, 0)
    with pytest.raises(RuntimeError):
        cache.evict(1)


def test_registry_and_bad_arguments() -> None:
    assert PREFIX_CACHES.names() == ["naive", "radix"]
    assert isinstance(create_prefix_cache("radix", CPU, page_size=16), RadixPrefixCache)
    with pytest.raises(ValueError, match="radix"):
        create_prefix_cache("lru", CPU)
    with pytest.raises(ValueError, match="page_size"):
        create_prefix_cache("radix", CPU, page_size=0)
    with pytest.raises(ValueError, match="2 slot indices"):
        RadixPrefixCache(CPU).insert_prefix(ids(1, 2, 3), slots(0, 2))


@pytest.mark.parametrize("n", [0, 1, 5, 300])
def test_compare_key(n: int) -> None:
    rng = random.Random(n)
    a = [rng.randrange(3) for _ in range(n)]
    b = a[: n // 2] + [rng.randrange(3) for _ in range(n - n // 2 + 3)]
    want = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert compare_key(torch.tensor(a, dtype=torch.int32), torch.tensor(b, dtype=torch.int32)) == want
