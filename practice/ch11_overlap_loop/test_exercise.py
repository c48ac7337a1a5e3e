"""ch11_overlap_loop 的测试。被测模块固定叫 solution。"""
from solution import simulate


def test_readme_example():
    assert simulate({"a": 2}, {}) == ({"a": [0, 1]}, [("a", 2)])


def test_every_request_released_exactly_once():
    outputs, released = simulate({"a": 1, "b": 3, "c": 2}, {})
    assert outputs == {"a": [0], "b": [0, 1, 2], "c": [0, 1]}
    assert sorted(u for u, _ in released) == ["a", "b", "c"]


def test_abort_of_in_flight_request_waits_for_that_step():
    # a 要 3 个 token；b 要 1 个。a 被中止于第 1 轮：那时步 1 在飞行中，a 在里面 → 等步 1 处理完（第 2 轮）再释放
    outputs, released = simulate({"a": 3, "b": 1}, {1: ["a"]})
    assert outputs == {"a": [], "b": [0]}
    assert ("a", 2) in released and ("b", 1) in released


def test_abort_when_not_in_flight_releases_at_once():
    # a 已经提交完 1 步（要 1 个 token）：第 1 轮没有新的步，a 不在飞行中
    outputs, released = simulate({"a": 1, "b": 5}, {1: ["a"]})
    assert outputs["a"] == [] and released[0] == ("a", 1)


def test_abort_of_finished_or_unknown_does_nothing():
    outputs, released = simulate({"a": 1}, {5: ["a", "zzz"]})
    assert outputs == {"a": [0]} and released == [("a", 1)]


def test_tokens_after_abort_are_dropped():
    outputs, _ = simulate({"a": 10}, {3: ["a"]})
    assert outputs["a"] == [0, 1]  # 步 0、1 在中止前处理；步 2 在第 3 轮处理时 a 已中止，步 3 丢掉


def test_release_rounds_exact():
    # 被中止时在飞行中的请求，要等它最后在的那一步处理完才释放——不早一轮，也不晚一轮
    assert simulate({"a": 5}, {2: ["a"]}) == ({"a": [0]}, [("a", 3)])
    assert simulate({"a": 4, "b": 4}, {2: ["a"], 3: ["b"]}) == ({"a": [0], "b": [0, 1]}, [("a", 3), ("b", 4)])
    assert simulate({"a": 6, "b": 2}, {1: ["a"]}) == ({"a": [], "b": [0, 1]}, [("a", 2), ("b", 2)])
