"""ch01_registry 的测试。被测模块固定叫 solution（judge 和浏览器都会把你的代码放成 solution.py）。"""
import pytest

from solution import Registry


def make():
    reg = Registry("attention backend")

    @reg.register("torch")
    def torch_backend():
        return "torch"

    @reg.register("fi")
    def fi_backend():
        return "fi"

    return reg


def test_register_and_get():
    reg = make()
    assert reg.get("torch")() == "torch"
    assert reg.get("fi")() == "fi"


def test_register_returns_object_unchanged():
    reg = Registry("model")

    def build(x):
        return x * 2

    decorated = reg.register("double")(build)
    assert decorated is build          # 装饰器原样返回
    assert decorated(21) == 42
    assert reg.get("double") is build


def test_register_class():
    reg = Registry("model")

    @reg.register("LlamaForCausalLM")
    class Llama:
        pass

    assert reg.get("LlamaForCausalLM") is Llama
    assert isinstance(Llama(), Llama)


def test_getitem_same_as_get():
    reg = make()
    assert reg["fi"] is reg.get("fi")
    with pytest.raises(ValueError):
        reg["nope"]


def test_duplicate_name_raises_and_keeps_first():
    reg = make()
    first = reg.get("torch")
    with pytest.raises(ValueError) as info:

        @reg.register("torch")
        def other():
            return "other"

    assert "torch" in str(info.value)
    assert reg.get("torch") is first   # 第一次的登记不被覆盖
    assert len(reg) == 2


def test_unknown_name_message_lists_known_names_sorted():
    reg = make()

    @reg.register("aaa")
    def a():
        return "a"

    with pytest.raises(ValueError) as info:
        reg.get("flashinfer")
    msg = str(info.value)
    assert "flashinfer" in msg
    # 已知名字都要出现，并且按字母序：aaa < fi < torch
    positions = [msg.find(n) for n in ("aaa", "fi", "torch")]
    assert all(p >= 0 for p in positions), msg
    # "fi" 也出现在 "flashinfer" 里，所以从 "aaa" 之后找
    after = msg[positions[0]:]
    assert after.find("aaa") < after.find("fi") < after.find("torch"), msg


def test_unknown_name_in_empty_registry():
    reg = Registry("cache")
    with pytest.raises(ValueError) as info:
        reg.get("radix")
    assert "radix" in str(info.value)


def test_names_sorted_and_contains():
    reg = make()
    assert reg.names() == ["fi", "torch"]
    assert "torch" in reg
    assert "fi" in reg
    assert "radix" not in reg
    assert 42 not in reg       # 可哈希的非字符串也只是 False，不报错


def test_len():
    reg = Registry("x")
    assert len(reg) == 0
    reg.register("a")(len)
    reg.register("b")(max)
    assert len(reg) == 2


def test_names_returns_a_copy():
    reg = make()
    names = reg.names()
    names.append("hacked")
    assert reg.names() == ["fi", "torch"]
    assert "hacked" not in reg


def test_registries_are_independent():
    # 常见错误：把字典写成类属性，所有 Registry 共用一份
    a = Registry("a")
    b = Registry("b")
    a.register("x")(len)
    assert "x" in a
    assert "x" not in b
    assert b.names() == []
    b.register("x")(max)        # 在另一个注册表里用同一个名字是允许的
    assert a.get("x") is len and b.get("x") is max
