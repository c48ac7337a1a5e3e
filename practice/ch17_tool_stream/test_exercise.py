"""ch17_tool_stream 的测试。被测模块固定叫 solution（judge 和浏览器都会把你的代码放成 solution.py）。"""
import json
import random

from solution import END, START, ToolCallSplitter, held, parse_call

NAMES = {"get_weather", "get_time"}
WEATHER = '{"name": "get_weather", "arguments": {"city": "北京"}}'


def run(pieces):
    """一段一段喂、最后 finish：拼起来的内容和全部调用。"""
    splitter = ToolCallSplitter(NAMES)
    content, calls = "", []
    for piece in pieces:
        text, more = splitter.feed(piece)
        content, calls = content + text, calls + more
    text, more = splitter.finish()
    return content + text, calls + more


def reference(text):
    """整段文字一次切完（不流式）的答案：测试自己的写法，和你的实现无关。"""
    content, calls, pos = [], [], 0
    while True:
        k = text.find(START, pos)
        if k < 0:
            content.append(text[pos:])
            break
        content.append(text[pos:k].rstrip())
        e = text.find(END, k + len(START))
        if e < 0:
            content.append(text[k:])
            break
        body = text[k + len(START):e]
        try:
            obj = json.loads(body)
        except ValueError:
            obj = None
        args = obj.get("arguments", {}) if isinstance(obj, dict) else None
        if isinstance(obj, dict) and obj.get("name") in NAMES and isinstance(args, dict):
            calls.append({"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)})
        else:
            content.append(text[k:e + len(END)])
        pos = e + len(END)
    joined = "".join(content)
    return (joined.rstrip() if calls else joined), calls


def test_held():
    assert held("abc <too", START) == 4
    assert held("abc <", START) == 1
    assert held("abc", START) == 0
    assert held("", START) == 0
    assert held("<tool_call", START) == 10
    assert held("<tool_call>", START) == 0  # 整个标记不算"半个"
    assert held("</tool_c", END) == 8


def test_parse_call():
    assert parse_call(WEATHER, NAMES) == {"name": "get_weather", "arguments": '{"city": "北京"}'}
    assert parse_call('\n{"name": "get_time"}\n', NAMES) == {"name": "get_time", "arguments": "{}"}
    assert parse_call('{"name": "fly", "arguments": {}}', NAMES) is None  # 没声明的函数
    assert parse_call('{"name": "get_time", "arguments": "now"}', NAMES) is None  # 参数不是对象
    assert parse_call('{"name": "get_time"', NAMES) is None  # JSON 没写完
    assert parse_call('["get_time"]', NAMES) is None


def test_whole_answer():
    text = f"好的，我查一下。\n{START}\n{WEATHER}\n{END}\n{START}\n{{\"name\": \"get_time\"}}\n{END}\n"
    assert run([text]) == ("好的，我查一下。", [{"name": "get_weather", "arguments": '{"city": "北京"}'},
                                            {"name": "get_time", "arguments": "{}"}])


def test_holds_half_a_mark_and_trailing_space():
    splitter = ToolCallSplitter(NAMES)
    assert splitter.feed("Hi <tool") == ("Hi", [])  # 空格和 "<tool" 扣着
    assert splitter.feed("box> ok") == (" <toolbox> ok", [])  # 不是标记：原样交出
    assert splitter.feed(f"\n{START}{WEATHER}") == ("", [])  # 在调用里面：什么也不交
    assert splitter.feed(END) == ("", [{"name": "get_weather", "arguments": '{"city": "北京"}'}])
    assert splitter.finish() == ("", [])


def test_bad_blocks_are_content():
    bad = f"a {START}{{\"name\": \"fly\"}}{END} b {START}not json{END}"
    assert run([bad]) == (f"a{START}{{\"name\": \"fly\"}}{END} b{START}not json{END}", [])
    assert run([f"x {START}{WEATHER}"]) == (f"x{START}{WEATHER}", [])  # 没写完的调用


def test_trailing_space_kept_only_without_calls():
    assert run(["hello \n"]) == ("hello \n", [])
    assert run([f"{START}{WEATHER}{END} \n"])[0] == ""
    assert run(["  "]) == ("  ", [])


def test_any_split_is_the_same():
    text = f"Let me check.\n\n{START}\n{WEATHER}\n{END}\n{START}bad{END} <tool x\n{START}{{\"name\": \"get_time\"}}{END}\n"
    whole = run([text])
    assert whole == reference(text)
    assert run(list(text)) == whole
    for k in range(len(text) + 1):
        assert run([text[:k], text[k:]]) == whole, k


def test_random_answers():
    rng = random.Random(0)
    parts = ["好", "ok", " ", "\n", "<", "<tool", "<tool_c", START, END, WEATHER, '{"name": "get_time"}',
             '{"name": "fly"}', "{", "}", "</", "x"]
    for _ in range(300):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 12)))
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 4))))
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        assert run(pieces) == reference(text), (text, pieces)
