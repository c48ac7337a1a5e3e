# Tangled from book/chapters/ch17_structured.ipynb — edit the notebook, not this file.
"""从模型写的文字里切出结构（附录）：工具调用（tools 怎么进提示词，<tool_call> 怎么变回 OpenAI 的 tool_calls），
和开头 <think>…</think> 里的思考（reasoning_content）。"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

from minisgl.structured.grammar import THINK_END, THINK_START
from minisgl.utils.hf import load_tokenizer

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"  # Qwen2.5、Qwen3、Hermes……的调用格式
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}  # 没给 parameters：只能是 {}


def json_or_none(text: str) -> Any:
    """text 按 JSON 解析出来的值；不是合法的 JSON 时 None。NaN、Infinity 不是 JSON（Python 的 json 默认收下）；
    套了上千层（递归出错）、几千位的整数（int 拒绝转换）也当作不是：这里的文字来自客户端或模型，什么都可能有。"""
    try:
        return json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError):  # JSONDecodeError 也是 ValueError
        return None


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def settled(text: str, mark: str) -> str:
    """流式切分时 text 里现在就能交出去的那段：去掉末尾的空白和半个 mark（"<tool"、"</thi"）——后面来的文字
    才能说明它们属于哪一边。两个切分器共用这一条规则，所以怎样分段喂都切得一样。"""
    keep = next((m for m in range(len(mark) - 1, 0, -1) if text.endswith(mark[:m])), 0)
    return text[:len(text) - keep].rstrip()


@functools.lru_cache(maxsize=8)
def _templates(model_path: str) -> Tuple[str, ...]:
    """模型目录里对话模板的原文：chat_template.jinja，或 tokenizer_config.json 的 chat_template（一个，或几个有名字
    的）。服务启动时不加载分词器（那是分词进程的事），所以直接读文件。"""
    path = Path(model_path)
    texts = [path.joinpath("chat_template.jinja").read_text()] if (path / "chat_template.jinja").is_file() else []
    if (path / "tokenizer_config.json").is_file():
        template = json.loads((path / "tokenizer_config.json").read_text()).get("chat_template") or []
        texts += [template] if isinstance(template, str) else [t.get("template", "") for t in template]
    return tuple(texts)


def template_writes_tool_calls(model_path: str) -> bool:
    """这个模型的对话模板会不会把 tools 写进提示词、教模型用 <tool_call>{...}</tool_call> 回答。"""
    return any("tools" in t and TOOL_CALL_START in t for t in _templates(model_path))


def template_thinks(model_path: str) -> bool:
    """这个模型会不会先在 <think>…</think> 里思考（模板里提到它：Qwen3 的模板在多轮对话里去掉上一轮的思考）。"""
    return any(THINK_START in t for t in _templates(model_path))


_tokenizer = functools.lru_cache(maxsize=1)(load_tokenizer)  # 服务进程里只有 prompt_thinking 用它


def template_tokenizer_loaded() -> bool:
    """prompt_thinking 要的分词器加载过了：之后套一次模板不到一毫秒。"""
    return _tokenizer.cache_info().currsize > 0


@functools.lru_cache(maxsize=32)
def prompt_thinking(model_path: str, options: str) -> str:
    """套上模板、加上生成提示的提示词怎样收尾。"opened"：以 <think> 结尾，模板替模型开了头（DeepSeek-R1 的蒸馏模型、
    Qwen3 的 Thinking-2507），回答里只有思考的正文和 </think>；"closed"：以 </think> 结尾，一段空的思考已经关上
    （Qwen3 的 enable_thinking: false），模型不再思考；"tagged"：都不是，<think> 由模型自己写（Qwen3 原版）。
    options：请求的 chat_template_kwargs（JSON 文本，作缓存的键）。拿一条消息套一次模板就知道；第一次要加载分词器
    （一秒上下），之后查缓存。"""
    try:
        prompt = _tokenizer(model_path).apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                                            add_generation_prompt=True, **json.loads(options))
    except Exception:  # 模板不认这些选项：请求本身在分词进程里会得到 400
        return "tagged"
    tail = prompt.rstrip()
    return "opened" if tail.endswith(THINK_START) else "closed" if tail.endswith(THINK_END) else "tagged"


def forced_schema(tools: List[Dict[str, Any]], name: str | None, parallel: bool) -> Dict[str, Any]:
    """tool_choice 是 required（name=None：任选几个）或指定了一个函数时，输出的 JSON Schema：调用的数组，每一项是
    {"name": 工具名, "arguments": 合乎它 parameters 的对象}。指定了函数、或 parallel_tool_calls=false 时只一项。"""
    items = [{"type": "object", "properties": {"name": {"const": f["name"]},
                                               "arguments": f.get("parameters") or NO_PARAMETERS},
              "required": ["name", "arguments"], "additionalProperties": False}
             for f in (t["function"] for t in tools) if name is None or f["name"] == name]
    one = name is not None or not parallel
    return {"type": "array", "items": items[0] if len(items) == 1 else {"anyOf": items}, "minItems": 1,
            **({"maxItems": 1} if one else {})}


@dataclass
class ToolCalls:
    """一个对话请求的工具设定。tools：OpenAI 形状的工具（也原样交给对话模板）；forced：tool_choice 是 required 或
    指定了函数，输出由语法限定成调用的 JSON 数组；named：指定了函数（OpenAI 这时的 finish_reason 是 stop）；
    parallel：parallel_tool_calls，false 时一个回答至多交出一个调用。"""

    tools: List[Dict[str, Any]]
    forced: bool = False
    named: bool = False
    parallel: bool = True

    def parser(self, id_prefix: str) -> ToolCallParser:
        return ToolCallParser({t["function"]["name"] for t in self.tools}, self.forced, id_prefix, self.parallel)

    def finish_reason(self, reason: str | None, parser: ToolCallParser) -> str | None:
        """模型正常写完（stop）、写出了调用：tool_calls；指定了函数时 OpenAI 仍说 stop。"""
        return "tool_calls" if reason == "stop" and parser.calls and not self.named else reason


class ToolCallParser:
    """一个回答的文字 → 给用户的内容 + 调用 [{"id", "name", "arguments"}]。feed 一段一段地喂（流式时每来一段喂
    一次，非流式时整段喂一次），finish 在回答结束时调一次；两种喂法切出来的内容和调用相同。

    不强制时：<tool_call> 和 </tool_call> 之间是 {"name": 声明过的工具, "arguments": 对象} 就是一次调用，否则原样
    算内容；紧挨在调用前面的空白、有调用时回答末尾的空白不算内容。强制时：整个输出是语法保证了的调用数组，结束时
    一起解析（语法已经管着个数）。parallel=False 时不强制的回答里第一个之后的调用丢掉：客户端说了只要一个。"""

    def __init__(self, names: Set[str], forced: bool, id_prefix: str, parallel: bool = True) -> None:
        self.names, self.forced, self.id_prefix, self.parallel = names, forced, id_prefix, parallel
        self.buf = ""  # 还定不下来的文字
        self.inside = False  # buf 在一个 <tool_call> 里
        self.calls = 0  # 交出去了几个调用

    def feed(self, text: str) -> Tuple[str, List[Dict[str, Any]]]:
        self.buf += text
        if self.forced:
            return "", []
        content, calls = [], []
        while True:
            mark = TOOL_CALL_END if self.inside else TOOL_CALL_START
            k = self.buf.find(mark)
            if k < 0:
                if not self.inside:  # 末尾的空白和半个 "<tool_call>" 先扣着：后面若是调用，它们都不算内容
                    done = settled(self.buf, mark)
                    content.append(done)
                    self.buf = self.buf[len(done):]
                return "".join(content), calls
            head, self.buf = self.buf[:k], self.buf[k + len(mark):]
            call = self._call(head) if self.inside else None
            if not self.inside:
                content.append(head.rstrip())  # 紧挨在调用前面的空白不算内容
            elif call is None:  # 不是合法的调用：原样还给内容
                content.append(TOOL_CALL_START + head + TOOL_CALL_END)
            elif call["index"] == 0 or self.parallel:
                calls.append(call)
            self.inside = not self.inside

    def finish(self) -> Tuple[str, List[Dict[str, Any]]]:
        text, self.buf = self.buf, ""
        if self.forced:
            items = json_or_none(text)
            if items is None:  # max_tokens 用完、数组没写完：写了的原样算内容
                return text, []
            return "", [self._make(item["name"], item["arguments"]) for item in items]
        if self.inside:  # 一个 <tool_call> 没写完就结束了：原样算内容
            text, self.inside = TOOL_CALL_START + text, False
        return (text.rstrip() if self.calls else text), []  # 有调用时，最后扣着的空白不算内容

    def _call(self, body: str) -> Dict[str, Any] | None:
        obj = json_or_none(body)
        if not isinstance(obj, dict) or obj.get("name") not in self.names:
            return None
        arguments = obj.get("arguments", obj.get("parameters", {}))  # 有的模型写 parameters
        return self._make(obj["name"], arguments) if isinstance(arguments, dict) else None

    def _make(self, name: str, arguments: Dict[str, Any]) -> Dict[str, Any]:
        self.calls += 1
        return {"index": self.calls - 1, "id": f"{self.id_prefix}_{self.calls - 1}", "name": name,
                "arguments": json.dumps(arguments, ensure_ascii=False)}


class ReasoningParser:
    """回答开头的 <think>…</think> → 思考（reasoning_content），其余是内容；不以 <think> 开头的回答全是内容。和
    ToolCallParser 一样可以一段一段地喂，两种喂法切得一样：开头还看不出来（空白、"<thi"）时先扣着；思考和其后内容
    两头的空白不算（末尾的空白和半个 </think> 先扣着）。opened：提示词已经以 <think> 结尾（prompt_thinking），
    回答从第一个字起就是思考，直到 </think>（它若又写了一个 <think>，去掉）。"""

    def __init__(self, opened: bool = False) -> None:
        self.buf = ""
        self.opened = opened
        self.state = "start"  # start：还不知道有没有思考 → think：在思考里 → content：之后都是内容
        self.lead = False  # 刚进入思考、刚出思考：开头的空白不算
        self.thought = False  # 有思考（进过 think）：usage 的 reasoning_tokens 才算数

    def feed(self, text: str) -> Tuple[str, str]:
        """喂一段新文字，返回 (这次能交出的思考, 这次能交出的内容)。"""
        self.buf += text
        if self.state == "start":
            head = self.buf.lstrip()
            if len(head) < len(THINK_START) and THINK_START.startswith(head):
                return "", ""  # 空白，或 "<thi" 这样的半个标记：再等一段
            if head.startswith(THINK_START) or self.opened:
                self.state, self.lead, self.thought = "think", True, True
                self.buf = head.removeprefix(THINK_START)
            else:
                self.state = "content"
        if self.lead:
            self.buf = self.buf.lstrip()
            if not self.buf:
                return "", ""
            self.lead = False
        if self.state == "think":
            k = self.buf.find(THINK_END)
            if k < 0:  # 末尾的空白和半个 </think> 扣着
                done = settled(self.buf, THINK_END)
                self.buf = self.buf[len(done):]
                return done, ""
            thought, self.buf = self.buf[:k].rstrip(), self.buf[k + len(THINK_END):]
            self.state, self.lead = "content", True
            return thought, self.feed("")[1]
        content, self.buf = self.buf, ""
        return "", content

    def finish(self) -> Tuple[str, str]:
        """回答结束：扣着的交出来。没写完的思考仍算思考；只有空白或半个 "<think>" 的回答，原样是内容（opened 时
        是思考）。"""
        text, self.buf = self.buf, ""
        if self.state == "think" or (self.state == "start" and self.opened):
            self.thought = True
            return (text.lstrip() if self.state == "start" else text).rstrip(), ""
        return "", "" if self.lead else text
