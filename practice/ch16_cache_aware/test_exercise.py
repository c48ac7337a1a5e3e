"""ch16_cache_aware 的测试。被测模块固定叫 solution（judge 和浏览器都会把你的代码放成 solution.py）。"""
import pytest

from solution import ApproxRouter

IDLE = {"a": 0, "b": 0}


def test_match_is_the_longest_common_prefix_with_any_text():
    r = ApproxRouter(["a", "b"])
    assert r.match("a", "anything") == 0
    assert r.route("hello world", IDLE) == "a"  # 两棵树都空：树最小的并列，取靠前的
    assert r.match("a", "hello there") == 6
    assert r.match("a", "hello world, again") == 11
    assert r.match("b", "hello there") == 0
    assert r.match("a", "") == 0


def test_tree_size_counts_distinct_prefixes():
    r = ApproxRouter(["a"])
    assert r.tree_size("a") == 0
    r.route("abc", {"a": 0})
    r.route("abd", {"a": 0})
    assert r.tree_size("a") == 4
    r.route("ab", {"a": 0})  # 已有的前缀：不加节点
    assert r.tree_size("a") == 4


def test_shared_prefix_goes_back_to_the_same_worker():
    r = ApproxRouter(["a", "b"])
    system = "You are a helpful assistant for the lighthouse museum. "
    first = r.route(system + "When do you open?", IDLE)
    assert first == "a"
    assert r.route("Something completely different", IDLE) == "b"  # 没有值得追的前缀：树更小的 b
    for q in ["Where is the entrance?", "How much is a ticket?", "Is there parking?"]:
        assert r.route(system + q, IDLE) == first
    assert r.route("Something completely different, again", IDLE) == "b"


def test_low_match_goes_to_the_smallest_tree():
    r = ApproxRouter(["a", "b", "c"])
    r.route("x" * 100, IDLE | {"c": 0})
    r.route("y" * 10, IDLE | {"c": 0})  # 去 b（a 的树大，b、c 都空，取靠前的 b）
    assert r.tree_size("a") == 100 and r.tree_size("b") == 10
    assert r.route("z", {"a": 0, "b": 0, "c": 0}) == "c"
    assert r.route("q", {"a": 0, "b": 0, "c": 0}) == "c"  # c 的树（1）仍然比 b（10）小


def test_threshold_is_strict():
    r = ApproxRouter(["a", "b"], cache_threshold=0.5)
    r.route("ab" + "c" * 20, IDLE)  # → a（22 个节点）
    assert r.route("q", IDLE) == "b"  # 匹配率 0 → 树小的 b（1 个节点）
    assert r.route("abXY", IDLE) == "b"  # a 上匹配 2/4 = 0.5，不大于阈值 → 树小的 b
    assert r.route("abcX", IDLE) == "a"  # 3/4 > 0.5 → a


def test_imbalance_needs_both_thresholds():
    r = ApproxRouter(["a", "b"])
    prompt = "the same long system prompt " * 4
    assert r.route(prompt, IDLE) == "a"
    assert r.route(prompt + "1", {"a": 100, "b": 160}) == "a"  # 差 60 ≤ 64：不算失衡，跟着前缀走
    assert r.route(prompt + "2", {"a": 3, "b": 1}) == "a"  # 比例 3 倍但差 2：不算失衡
    assert r.route(prompt + "3", {"a": 80, "b": 10}) == "b"  # 差 70 > 64 且 80 > 15：失衡，去负载小的
    assert r.match("b", prompt + "3") == len(prompt) + 1  # 失衡时选中的 worker 也记下了这个文本


def test_ties_and_bad_loads():
    r = ApproxRouter(["b", "a"])
    assert r.route("hi", {"a": 0, "b": 0}) == "b"  # 并列时按 workers 的顺序
    assert r.route("hi", {"a": 200, "b": 200}) == "b"
    with pytest.raises(ValueError):
        r.route("hi", {"a": 0})
    with pytest.raises(ValueError):
        r.route("hi", {"a": 0, "b": 0, "c": 0})
