# Tangled from book/chapters/ch15_server.ipynb and ch16_scale.ipynb and ch17_structured.ipynb — edit the notebooks, not this file.
from __future__ import annotations

import asyncio
import functools
import hmac
import json
import re
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, List, Literal, Tuple, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from starlette.exceptions import HTTPException

from minisgl import __version__
from minisgl.core import SamplingParams
from minisgl.message import (AbortMsg, BaseFrontendMsg, BaseTokenizerMsg, BatchFrontendMsg, SchedulerStats,
                             TokenizeMsg, UserReply)
from minisgl.structured import JSON_OBJECT_SCHEMA, check_grammar
from minisgl.tokenizer import nth_sample
from minisgl.utils import init_logger
from minisgl.utils.mp import ZmqAsyncPullQueue, ZmqAsyncPushQueue

from .args import ServerArgs, model_limits
from .tools import (ReasoningParser, ToolCallParser, ToolCalls, forced_schema, json_or_none, prompt_thinking,
                    template_thinks, template_tokenizer_loaded, template_writes_tool_calls)

logger = init_logger(__name__)
T = TypeVar("T")


def _unwrap(msg: BaseFrontendMsg) -> List[BaseFrontendMsg]:
    return msg.data if isinstance(msg, BatchFrontendMsg) else [msg]

def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()

@dataclass
class FrontendManager:
    config: ServerArgs
    send_tokenizer: List[ZmqAsyncPushQueue[BaseTokenizerMsg]]  # 每个分词进程一个（--num-tokenizer 0 时是 detokenizer）
    recv_tokenizer: ZmqAsyncPullQueue[BaseFrontendMsg]
    max_seq_len: int = 0  # 上下文长度：/v1/models 的 max_model_len
    vocab_size: int = 0  # 词表大小：检查 token id 提示词和 logit_bias
    uid_counter: int = 0
    initialized: bool = False
    ack_map: Dict[int, List[UserReply]] = field(default_factory=dict)
    event_map: Dict[int, asyncio.Event] = field(default_factory=dict)
    start_time: Dict[int, float] = field(default_factory=dict)
    metrics: Metrics = field(default_factory=lambda: Metrics())  # Metrics 在文件后面（/metrics 一节）定义
    dead: str | None = None  # 有工作进程退出了，或者服务在停：之后的请求一律 503

    def new_users(self, n: int = 1) -> List[int]:
        """n 个新请求（一个 HTTP 请求的 n 个回答）：各有 uid 和回复列表，共用一个 Event。"""
        event, now = asyncio.Event(), time.perf_counter()
        uids = list(range(self.uid_counter, self.uid_counter + n))
        self.uid_counter += n
        for uid in uids:
            self.ack_map[uid], self.event_map[uid], self.start_time[uid] = [], event, now
        return uids

    async def listen(self) -> None:
        while True:
            for reply in _unwrap(await self.recv_tokenizer.get()):
                if isinstance(reply, SchedulerStats):
                    self.metrics.stats = reply
                    continue
                assert isinstance(reply, UserReply), type(reply)
                if reply.uid not in self.ack_map:  # 已经结束或已取消的请求
                    continue
                self.ack_map[reply.uid].append(reply)
                self.event_map[reply.uid].set()

    def start(self) -> None:
        if not self.initialized:  # 第一次调用时（此时事件循环已经在运行）才能创建后台任务
            asyncio.create_task(self.listen())
            self.initialized = True

    async def wait_for_stats(self) -> None:
        """服务刚起来、listen() 还没收到调度器的第一条统计时：最多等 2 秒，不拿全 0 的页数充数。"""
        self.start()
        for _ in range(40):
            if self.metrics.ready:
                return
            await asyncio.sleep(0.05)

    async def send_one(self, msg: TokenizeMsg | AbortMsg) -> None:
        """同一个 uid 的消息总发给同一个分词进程：中止不会抢在请求前面（第 13 章）。一个新请求没发出去（服务在关闭、
        发的时候被取消）：它的登记忘掉，不留在等回复的几张表里。"""
        try:
            if self.dead is not None:
                raise APIError(503, f"the server is shutting down: {self.dead}", type="server_error")
            self.start()
            await self.send_tokenizer[msg.uid % len(self.send_tokenizer)].put(msg)
        except BaseException:
            if isinstance(msg, TokenizeMsg):
                self._forget(msg.uid)
            raise

    async def first_replies(self, uids: List[int], param: str, max_tokens_param: str = "max_tokens",
                            max_tokens_note: str = "") -> None:
        """等每个请求的第一条回复（不取走）：被拒绝或后端挂了时，HTTP 状态码还没发出去，来得及回一个错误。
        max_tokens_param：客户端给输出上限用的字段名，分词进程说 max_tokens 的地方换成它，值后面接上 max_tokens_note。"""
        event = self.event_map[uids[0]]
        try:
            while not all(self.ack_map[uid] for uid in uids):
                await event.wait()
                event.clear()
        except asyncio.CancelledError:  # 客户端在第一条回复之前就走了（until_disconnected 取消了它）
            self.metrics.left(len(uids))
            raise
        firsts = [self.ack_map[uid][0] for uid in uids]
        refused = [r for r in firsts if r.finished and r.finish_reason in ("abort", "error") and not r.completion_tokens]
        if not refused:
            return
        await self.abort_users([r.uid for r in firsts if not r.finished])  # 其余的（多半也会被拒绝）不用再算
        for uid in uids:
            self._forget(uid)
        r = refused[0]
        if r.finish_reason == "error":
            raise APIError(503, f"the server is shutting down: {self.dead}", type="server_error")
        if r.error is not None:  # 分词进程说了原因："max_tokens=... is too large ..."、提示词太长……
            error = re.sub(r"^max_tokens=(\d+)", lambda m: f"{max_tokens_param}={m[1]}{max_tokens_note}", r.error)
            field_name = re.match(r"(\w+)=", error)
            raise APIError(400, error, param=field_name.group(1) if field_name else param,
                           code="context_length_exceeded" if "context" in error else None)
        too_long = r.prompt_tokens >= self.max_seq_len  # 没说原因的拒绝：只有真放不下时才说是上下文超长
        raise APIError(400, f"the request was refused by the scheduler (prompt of {r.prompt_tokens} tokens, context "
                            f"{self.max_seq_len}{'' if too_long else '; the server log says why'})", param=param,
                       code="context_length_exceeded" if too_long else None)

    async def wait_for_replies(self, uids: List[int]) -> AsyncIterator[List[Tuple[int, UserReply]]]:
        """每次醒来，一次取走这组请求已经到了的所有回复：(第几个回答, 回复) 的列表；每个都 finished 才结束。"""
        event, running = self.event_map[uids[0]], dict(enumerate(uids))
        try:
            while running:
                got: List[Tuple[int, UserReply]] = []
                for i, uid in list(running.items()):
                    pending, self.ack_map[uid] = self.ack_map[uid], []
                    for ack in pending:
                        got.append((i, ack))
                        if ack.finished:
                            if ack.finish_reason != "error":
                                self.metrics.observe(ack, time.perf_counter() - self.start_time[uid])
                            del running[i]
                            break
                if got:
                    yield got
                elif running:
                    await event.wait()
                    event.clear()  # 先清再取（下一轮）：清之后到的回复会再 set，不会漏
        finally:
            if running:  # 没等到结束就走了（客户端断开、shell 里的 Ctrl-C）：后端会中止它们，/metrics 记作 abort
                self.metrics.left(len(running))
            for uid in uids:
                self._forget(uid)

    async def wait_for_ack(self, uid: int) -> AsyncIterator[UserReply]:
        """一个请求的回复，一条一条地给：不在乎写几次的地方（终端）用它。"""
        async for replies in self.wait_for_replies([uid]):
            for _, ack in replies:
                yield ack

    def _forget(self, uid: int) -> None:
        self.ack_map.pop(uid, None)
        self.event_map.pop(uid, None)
        self.start_time.pop(uid, None)

    def fail_all(self, reason: str) -> None:
        """工作进程退出了，或者服务要停了（Ctrl-C、SIGTERM）：每个还在等回复的请求收到一条 "error" 结束，不会永远
        挂着，也不会被拦腰取消。只算第一次：工作进程刚死、又来了 Ctrl-C，原因还是前者，也不给谁塞第二条结束。"""
        if self.dead is not None:
            return
        self.dead = reason
        for uid, event in self.event_map.items():
            self.ack_map[uid].append(UserReply(uid=uid, incremental_output="", finished=True, finish_reason="error"))
            event.set()

    async def stream_with_cancellation(self, gen: AsyncIterator[bytes], uids: List[int]) -> AsyncIterator[bytes]:
        """客户端断开连接时，通知后端中止这些请求，释放它们占用的 KV 缓存。

        发现断开的是 Starlette：StreamingResponse 一边写一边听 http.disconnect，听到就取消写的任务。这个生成器
        正等着回复时收到 CancelledError，正停在 yield 时被关掉（GeneratorExit）：两种都走 finally。"""
        finished = False
        try:
            async for chunk in gen:
                yield chunk
            finished = True
        finally:
            if not finished:
                asyncio.create_task(self.abort_users(uids))

    async def collect_with_cancellation(self, uids: List[int], request: Request) -> List[List[UserReply]]:
        """非流式：收集每个请求的全部回复；其间每 0.1 秒看一次客户端还在不在，断开了就中止。"""
        async def collect() -> List[List[UserReply]]:
            out: List[List[UserReply]] = [[] for _ in uids]
            async for replies in self.wait_for_replies(uids):
                for i, ack in replies:
                    out[i].append(ack)
            return out

        return await self.until_disconnected(collect(), uids, request)

    async def until_disconnected(self, work: Awaitable[T], uids: List[int], request: Request) -> T:
        """等 work（first_replies 或者收集回复）做完；其间每 0.1 秒看一次客户端还在不在。断开了就中止这些请求
        （还在排队、一条回复也没有的也一样：不然它们要等到被接纳、算完 prefill 才被发现），抛 ClientGone。"""
        task = asyncio.ensure_future(work)
        try:
            while not (await asyncio.wait({task}, timeout=0.1))[0]:
                if await request.is_disconnected():
                    raise ClientGone
            return task.result()
        except (ClientGone, asyncio.CancelledError):  # 客户端走了，或者服务在关闭：中止这些请求，再往外抛
            task.cancel()  # 被取消的 first_replies / wait_for_replies 把还没结束的请求记作 abort
            asyncio.create_task(self.abort_users(uids))
            raise

    async def abort_users(self, uids: List[int]) -> None:
        for uid in uids:
            self._forget(uid)
        if uids and self.dead is None:
            logger.info(f"Aborting request{'s' if len(uids) > 1 else ''} {', '.join(map(str, uids))}")  # 常事：客户端走了
            for uid in uids:
                await self.send_one(AbortMsg(uid=uid))

    def shutdown(self) -> None:
        for q in self.send_tokenizer:
            q.stop()
        self.recv_tokenizer.stop()

_STATE: FrontendManager | None = None

def create_frontend(config: ServerArgs) -> FrontendManager:
    """在主进程里建好 API Server 的队列（绑定前端地址），之后再启动工作进程。"""
    global _STATE
    max_seq_len, vocab_size = model_limits(config)
    _STATE = FrontendManager(
        config=config, max_seq_len=max_seq_len, vocab_size=vocab_size,
        send_tokenizer=[ZmqAsyncPushQueue(addr, create=config.tokenizer_create_addr)
                        for addr in config.tokenizer_addrs],
        recv_tokenizer=ZmqAsyncPullQueue(config.zmq_frontend_addr, create=True))
    return _STATE

def get_state() -> FrontendManager:
    assert _STATE is not None, "create_frontend() first"
    return _STATE


_SURROGATE = re.compile("[\ud800-\udfff]")  # JSON 里落单的 "\ud800" 这类 UTF-16 代理：不是合法的 Unicode 文字
_LONE_SURROGATE = ("is not valid Unicode text: it has a lone UTF-16 surrogate "
                   "(a \\ud800-\\udfff escape without its pair)")
MAX_JSON_DEPTH = 64  # 请求体里数组、对象最多套几层（OpenAI 的结构化输出只许 5 层）：再深的，后面的递归会出错


class _BodyError(ValueError):
    """整个请求体的检查（_Body）查出的错：where 是出错的位置（messages.0.content），错误的 param 是它的第一段。"""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where} {problem}")
        self.where = where


def _bad_part(body: Dict[str, Any]) -> _BodyError | None:
    """解析好的请求体里第一处坏的地方（按在 JSON 里的先后）：套得比 MAX_JSON_DEPTH 层还深的数组或对象，或者带落单
    代理的字符串（或字典的键）；没有时 None。用一个栈走一遍，不递归：再深也不会栈溢出。"""
    stack: List[Tuple[Any, str, int]] = [(body, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return _BodyError(path, _LONE_SURROGATE)
            continue
        if depth > MAX_JSON_DEPTH:  # 第 12 章的序列化是递归的：几百层就超过 Python 的递归上限
            return _BodyError(path, f"nests arrays and objects more than {MAX_JSON_DEPTH} levels deep")
        children = []
        for key, value in item.items() if isinstance(item, dict) else enumerate(item):
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and _SURROGATE.search(key):  # 键里的代理：错误消息里写成转义
                return _BodyError(where.encode("utf-8", "backslashreplace").decode(), _LONE_SURROGATE)
            if isinstance(value, (str, dict, list)):  # 数、布尔不用看：一个十万个 token id 的提示词不造十万个路径
                children.append((value, where, depth + 1))
        stack += reversed(children)  # 先看前面的
    return None

class _Strict(BaseModel):
    """请求体（和其中的消息、格式）的基类：不认识的字段、类型不对的值回 400（见 app 的错误处理）；值为 null 的字段
    和没给一样（OpenAI 的约定）。"""

    model_config = ConfigDict(extra="forbid", strict=True)  # strict："3"、"true" 不替客户端转成 3、True

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data

class _Body(_Strict):
    """一个接口的整个请求体：套得太深的 JSON、带落单代理的文字回 400。整个请求体在这里查一遍，嵌套的消息、格式
    不再各查一遍。"""

    @model_validator(mode="before")
    @classmethod
    def _valid_text(cls, data: Any) -> Any:
        bad = _bad_part(data) if isinstance(data, dict) else None
        if bad is not None:  # 不拦在这里，就要到发给分词进程、序列化或按 UTF-8 编码时才出错：那时已是一个 500
            raise bad
        return data

class FunctionCall(_Strict):
    name: str
    arguments: str  # 参数对象的 JSON 文本（OpenAI 的形状）

class ToolCall(_Strict):
    """assistant 消息里模型上一轮的调用：多轮对话时客户端把它原样发回来。"""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall

class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | List[Dict[str, Any]] | None = None  # 一段文字，或 [{"type": "text", "text": ...}, ...]
    name: str | None = None
    tool_calls: List[ToolCall] | None = None  # 只在 assistant 消息里（这时可以没有 content）：它调用了哪些工具
    tool_call_id: str | None = None  # 只在 tool 消息里：这是哪一次调用的结果
    reasoning_content: str | None = None  # 只在 assistant 消息里：它的思考（客户端把我们给的原样发回来）

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        for name in ("tool_calls", "reasoning_content"):
            if getattr(self, name) is not None and self.role != "assistant":
                raise ValueError(f"only assistant messages have {name}")
        if (self.tool_call_id is not None) != (self.role == "tool"):
            raise ValueError("a tool message needs tool_call_id, and only tool messages have one")
        if self.content is None and not self.tool_calls:
            raise ValueError(f"a {self.role} message needs content")
        for call in self.tool_calls or []:
            if not isinstance(json_or_none(call.function.arguments), dict):
                raise ValueError(f"the arguments of the call to {call.function.name!r} must be a JSON object, "
                                 f"got {call.function.arguments[:40]!r}")
        return self

    def to_template(self) -> Dict[str, Any]:
        if self.content is None or isinstance(self.content, str):
            text = self.content or ""
        elif all(part.get("type") == "text" and isinstance(part.get("text"), str) for part in self.content):
            text = "".join(part["text"] for part in self.content)
        else:
            raise APIError(400, "only text content parts are supported", param="messages")
        msg: Dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": text}
        if self.name:
            msg["name"] = self.name
        if self.tool_calls:  # 模板要的 arguments 是对象（Qwen 的模板收字符串也收对象，Llama 的只收对象）
            msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": json.loads(c.function.arguments)}} for c in self.tool_calls]
        if self.tool_call_id is not None:
            msg["tool_call_id"] = self.tool_call_id
        if self.reasoning_content is not None:  # Qwen3 的模板把这一轮调用工具之前的思考写回 <think> 里
            msg["reasoning_content"] = self.reasoning_content
        return msg


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool = False  # OpenAI 给片段加的随机填充（防旁路）：我们不加，true、false 的输出都一样

class JsonSchemaFormat(_Strict):
    """response_format 里的 json_schema（OpenAI 的形状）。"""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI 的规矩：字母、数字、_ 和 -，至多 64 个
    schema_: Dict[str, Any] = Field(alias="schema")  # BaseModel 自己有个 schema 方法：换个名字，按原名收
    description: str | None = None
    strict: bool | None = None  # 给不给、给什么，我们都严格按 schema 生成

class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None  # type 是 json_schema 时必须给，别的时候不许给

    @model_validator(mode="after")
    def _schema_only_for_json_schema(self) -> "ResponseFormat":
        if self.json_schema is not None and self.type != "json_schema":  # 不能悄悄不管客户端给的 schema
            raise ValueError(f'json_schema is only used with type "json_schema", not "{self.type}"')
        return self

def _object_parameters(parameters: Dict[str, Any] | None) -> Dict[str, Any] | None:
    """函数的参数是一个对象（OpenAI 的规矩）：parameters 是对象的 JSON Schema。别的类型（null、数组……）强制调用时
    会生成不是对象的 arguments，客户端送回来时又是 400。"""
    if parameters is not None and parameters.get("type", "object") != "object":
        raise ValueError(f'parameters must be the JSON Schema of an object, got "type": '
                         f'{json.dumps(parameters.get("type"))[:40]}')
    return parameters

class FunctionDef(_Strict):
    """tools 里的一个函数（OpenAI 的形状）：名字、说明、参数的 JSON Schema。"""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: Dict[str, Any] | None = None  # 不给：这个函数没有参数
    strict: bool | None = None  # 给不给，强制调用时都严格按 parameters 生成

    @field_validator("parameters")
    @classmethod
    def _object(cls, parameters: Dict[str, Any] | None) -> Dict[str, Any] | None:
        return _object_parameters(parameters)

class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef

class ToolName(_Strict):
    name: str

class NamedToolChoice(_Strict):
    """tool_choice 指定一个函数：{"type": "function", "function": {"name": ...}}。"""

    type: Literal["function"]
    function: ToolName

class _OpenAIRequest(_Body):
    """OpenAI 的每个接口都有的字段：模型名，和 OpenAI 说忽略也不改变输出的几个。"""

    model: str = "default"  # 照收不误：一个服务只有一个模型，响应里写的是它的名字
    # OpenAI 定义了、而按它自己的说明忽略也不改变输出的字段：收下，不用
    user: str | None = None  # 终端用户的标识（OpenAI 用来监控滥用）
    safety_identifier: str | None = None  # user 的新名字
    metadata: Dict[str, str] | None = None  # 给 OpenAI 存下来的对话贴的标签
    store: bool | None = None  # 要不要让 OpenAI 存下这次对话：我们从不存
    service_tier: str | None = None  # OpenAI 的计费、排队档次
    prompt_cache_key: str | None = None  # OpenAI 前缀缓存的路由提示：我们的前缀缓存按内容匹配，用不着

class _SamplingRequest(_OpenAIRequest):
    """两个接口共有的字段。采样参数不给（或给 null）就是 SamplingParams 的默认值，只有 temperature 用 OpenAI 的 1。"""

    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | List[str] | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: Dict[str, float] | None = None
    # 扩展字段（SGLang、vLLM 也有；官方客户端用 extra_body 传）
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None  # 压测时常用
    stop_token_ids: List[int] | None = None
    # SGLang 的扩展字段：sglang-router 转发时总是带上它们的默认值（附录），而那个值说的正是我们的做法；别的值不支持
    no_stop_trim: Literal[False] = False  # 输出里留着 stop 字符串
    skip_special_tokens: Literal[True] = True  # 输出里去掉特殊 token
    return_hidden_states: Literal[False] = False
    # 结构化输出（附录）：OpenAI 的 response_format，和 SGLang 的两个扩展字段；至多给一个
    response_format: ResponseFormat | None = None
    regex: str | None = None  # 输出整个匹配这个正则
    ebnf: str | None = None  # 输出合乎这个 EBNF 文法（起始规则叫 root）

class ChatCompletionRequest(_SamplingRequest):
    messages: List[ChatMessage] | None = None
    prompt: str | None = None  # 扩展：不套对话模板的纯提示词
    max_completion_tokens: int | None = None  # 新版 OpenAI 接口对 max_tokens 的叫法
    logprobs: bool = False
    top_logprobs: int | None = None
    modalities: List[str] | None = None  # 只认 ["text"]（默认）
    chat_template_kwargs: Dict[str, Any] | None = None  # 例如 {"enable_thinking": false}
    continue_final_message: bool = False  # SGLang、vLLM：接着最后一条 assistant 消息往下写（替模型写好回答的开头）
    # OpenAI 的思考力度。我们的模型只有想和不想两档：none 关掉思考（_thinking_off），medium（OpenAI 的默认）就是
    # 模型自己的样子；low、high 这些分不出来，给了是 400，不悄悄当成 medium
    reasoning_effort: Literal["none", "medium"] | None = None
    stream_reasoning: Literal[True] = True  # SGLang：思考边写边发（我们总是这样）
    # 工具调用和思考（本附录最后一节）
    separate_reasoning: bool = True  # SGLang：模板会思考的模型（Qwen3……），开头的 <think>…</think> 单独放
    tools: List[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None  # 不给：有 tools 时是 auto
    parallel_tool_calls: bool = True  # false：强制调用时只调一个

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value: Dict[str, Any] | None) -> Dict[str, Any] | None:
        return _template_variables(value)

    def tool_view(self) -> Tuple[List[Tool], Any, bool]:
        """(tools, tool_choice, parallel_tool_calls)：Responses API 的请求有同名的方法，把它扁平的工具换成这个形状。"""
        return self.tools or [], self.tool_choice or "auto", self.parallel_tool_calls

# apply_chat_template 自己的参数：服务按请求的字段给它们（tools、continue_final_message、add_generation_prompt……）。
# 放进 chat_template_kwargs，有的和服务给的撞车（got multiple values for keyword argument），有的悄悄绕过那些字段的
# 检查（continue_final_message 接着 user 消息写），return_dict 之类连返回值的类型都换了
_TEMPLATE_ARGS = ("conversation", "tools", "chat_template", "add_generation_prompt",
                  "continue_final_message", "tokenize", "sanitize_control_tokens", "padding", "truncation",
                  "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs")

def _template_variables(value: Dict[str, Any] | None) -> Dict[str, Any] | None:
    """chat_template_kwargs 只放模板里的变量（enable_thinking 这类）；apply_chat_template 自己的参数是 400。"""
    taken = [key for key in _TEMPLATE_ARGS if key in (value or {})]
    if taken:
        raise ValueError(f"{taken[0]!r} is an argument of apply_chat_template, which the server sets from the "
                         f"request's own fields; chat_template_kwargs is for the template's variables "
                         f"(e.g. enable_thinking)")
    return value

class CompletionRequest(_SamplingRequest):
    prompt: str | List[str] | List[int] | List[List[int]]  # 一个或几个提示词；文字，或者 token id
    logprobs: int | None = None  # 0..5：每个 token 另给最可能的几个
    echo: bool = False  # 回答前面带上提示词
    best_of: int | None = None  # 只认等于 n（或不给）：从 best_of 个里挑 n 个，我们不挑
    suffix: str | None = None  # 插在回答后面的文字（填空式补全）：不支持，给了就拒绝

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value: Any) -> Any:  # 四种形状都不是时，给一句人话，而不是 pydantic 对每种形状的抱怨
        ok = isinstance(value, str) or (isinstance(value, list) and (
            all(isinstance(p, str) for p in value) or all(isinstance(t, int) for t in value)
            or all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in value)))
        if not ok:
            raise ValueError("the prompt must be a string, a list of strings, a list of token ids (integers) or a "
                             "list of such lists")
        return value

_SAMPLING_FIELDS = ("top_p", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "top_k", "min_p",
                    "repetition_penalty", "ignore_eos", "stop_token_ids")

def _sampling_params(req: ChatCompletionRequest | CompletionRequest | ResponsesRequest, max_tokens: int | None,
                     top_logprobs: int | None, vocab_size: int) -> SamplingParams:
    """请求 → SamplingParams（检查由它做）。top_logprobs=None：不要 logprobs。上限不对时，错误里写客户端自己用的
    字段名（_max_tokens_param），而不是它没发过的 max_tokens。"""
    if not 1 <= getattr(req, "n", 1) <= 128:
        raise APIError(400, f"n={getattr(req, 'n')} is invalid: it must be in 1..128", param="n")
    for key in getattr(req, "logit_bias", None) or {}:
        if not (key.isascii() and key.isdigit() and len(key) <= len(str(vocab_size)) and int(key) < vocab_size):
            raise APIError(400, f"logit_bias has the key {key!r:.40}: keys are token ids in 0..{vocab_size - 1}",
                           param="logit_bias")
    kwargs = {name: getattr(req, name) for name in _SAMPLING_FIELDS if getattr(req, name, None) is not None}
    kwargs.update(temperature=req.temperature, max_tokens=max_tokens)
    if top_logprobs is not None:
        kwargs.update(logprobs=True, top_logprobs=top_logprobs)
    kwargs.update(_grammar(req)[1])  # spec 编不编译得了，_generate 在线程里查（_check_request_grammar）
    try:
        return SamplingParams(**kwargs)
    except ValueError as e:  # SamplingParams 的错误以字段名开头："top_p=0 must be in (0, 1]"
        message = re.sub(r"^max_tokens=", f"{_max_tokens_param(req)}=", str(e))
        raise APIError(400, message, param=message.split("=")[0]) from None

def _grammar(req: Any) -> Tuple[str | None, Dict[str, str]]:
    """response_format（Responses API 是 text.format）/ regex / ebnf → SamplingParams 的 json_schema / regex / ebnf：
    (请求里的参数名, 字段)。
    json_object 是"任意一个 JSON 对象"的 schema；{"type": "text"} 和没给一样。"""
    given: List[Tuple[str, str, str]] = []  # (参数名, 字段名, 原文)
    fmt, where = getattr(req, "response_format", None), "response_format"
    if isinstance(req, ResponsesRequest):  # Responses API 的格式在 text 里
        fmt, where = req.text.response_format() if req.text is not None else None, "text"
    if fmt is not None and fmt.type == "json_object":
        given.append((where, "json_schema", JSON_OBJECT_SCHEMA))
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise APIError(400, 'response_format of type "json_schema" needs "json_schema": {"name": ..., '
                                '"schema": {...}}', param="response_format")
        given.append((where, "json_schema", json.dumps(fmt.json_schema.schema_, ensure_ascii=False)))
    for name in ("regex", "ebnf"):
        if getattr(req, name, None) is not None:
            given.append((name, name, getattr(req, name)))
    tools, choice, parallel = req.tool_view() if hasattr(req, "tool_view") else ([], "none", True)
    if tools and (choice == "required" or isinstance(choice, NamedToolChoice)):
        name = choice.function.name if isinstance(choice, NamedToolChoice) else None
        schema = forced_schema([t.model_dump(exclude_none=True) for t in tools], name, parallel)
        given.append(("tool_choice", "json_schema", json.dumps(schema, ensure_ascii=False)))
    if len(given) > 1:
        raise APIError(400, f"{given[1][0]} cannot be combined with {given[0][0]}: give at most one of "
                            f"response_format, regex, ebnf and a forced tool_choice", param=given[1][0])
    return (given[0][0], {given[0][1]: given[0][2]}) if given else (None, {})

@functools.lru_cache(maxsize=1024)
def _check_grammar(kind: str, spec: str) -> None:
    """check_grammar（在逐字节的小词表上编译，比在模型的词表上快），记住通过了的 spec：同一个 schema 反复来，只查一次。"""
    check_grammar(kind, spec)

async def _check_request_grammar(sp: SamplingParams, req: Any = None) -> None:
    """坏的 schema / 正则 / 文法在这里回 400：调度器永远见不到它。编译在线程里做（xgrammar 编译时放开 GIL），
    事件循环照常给别的流发 token。错误里的 param 是请求里的名字，出错时才从 req 里找（_grammar 给的第一项）；
    没有 req 时 json_schema 算 response_format。"""
    if sp.grammar is None:
        return
    kind = sp.grammar[0]
    try:
        await asyncio.to_thread(_check_grammar, *sp.grammar)
    except (ValueError, ImportError) as e:
        param = _grammar(req)[0] if req is not None else "response_format" if kind == "json_schema" else kind
        if isinstance(e, ImportError):
            raise APIError(400, f"{param} needs structured output, which needs xgrammar on this server "
                                f"(pip install xgrammar)", param=param) from None
        raise APIError(400, f"{param}: {e}" if param in ("response_format", "text", "tool_choice") else str(e),
                       param=param) from None

MAX_STOP = 16  # OpenAI 收至多 4 个；多几个无妨，可 detokenizer 每个 token 都要把每个 stop 字符串找一遍


def _stop(req: ChatCompletionRequest | CompletionRequest) -> List[str]:
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stops) > MAX_STOP:
        raise APIError(400, f"stop has {len(stops)} strings; at most {MAX_STOP} are allowed", param="stop")
    return stops

def _check_stream_options(req: ChatCompletionRequest | CompletionRequest) -> None:
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "stream_options is only allowed when stream is true", param="stream_options")


def _usage(finals: List[UserReply], n: int, reasoning_tokens: int = 0) -> Dict[str, Any]:
    """finals：每个回答的最后一条回复，第 p 个提示词的第 j 个回答在 p*n+j。提示词各算一次（OpenAI 的算法）；
    命中的缓存取这个提示词的几个回答里最多的：n 个回答共用一次 prefill 时，后面几个整段命中。有思考时
    completion_tokens_details 说其中几个 token 是思考（没有思考的回答没有这个键，和第 15 章的一字不差）。"""
    groups = [finals[p:p + n] for p in range(0, len(finals), n)]
    prompt = sum(g[0].prompt_tokens for g in groups)
    completion = sum(r.completion_tokens for r in finals)
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
             "prompt_tokens_details": {"cached_tokens": sum(max(r.cached_tokens for r in g) for g in groups)}}
    if reasoning_tokens:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return usage

def _chat_logprobs(entries: List[Dict[str, Any]] | None, top: int) -> Dict[str, Any] | None:
    """detokenizer 给的每一项已经是对话接口的形状；top_logprobs 截到这个请求要的个数。"""
    if entries is None:
        return None
    return {"content": [{"token": e["token"], "bytes": e["bytes"], "logprob": e["logprob"],
                         "top_logprobs": e["top_logprobs"][:top]} for e in entries], "refusal": None}

def _completion_logprobs(entries: List[Dict[str, Any]] | None, top: int, offset: int) -> Dict[str, Any] | None:
    """补全接口的老形状：四个并列的列表。top_logprobs 是 {token: logprob}，按 OpenAI 的说明也含选中的 token；
    text_offset 是 detokenizer 给的字符位置（加上 offset：echo 时前面的提示词）——不是把 token 显示成的字符串的长度
    累加起来：半个汉字的 token 显示成 '\\xe4' 这样的四个字符，累加出来的位置会越过文字的末尾。"""
    if entries is None:
        return None
    out: Dict[str, List[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in entries:
        top_map = {t["token"]: t["logprob"] for t in e["top_logprobs"][:top]}
        top_map.setdefault(e["token"], e["logprob"])
        for key, value in zip(out, (e["token"], e["logprob"], top_map, offset + e["text_offset"])):
            out[key].append(value)
    return out

@dataclass
class _Shape:
    """一个 HTTP 请求的回答长什么样：接口、每个提示词几个回答、top_logprobs 的个数、echo 的提示词。"""

    head: Dict[str, Any]  # 每个响应、每个片段都有的 id、object、created、model
    chat: bool
    n: int
    top: int
    echo: List[str] | None = None  # 补全接口 echo=true 时：第 i 个回答前面的提示词
    tools: ToolCalls | None = None  # 对话请求带了 tools（tool_choice 不是 none）：回答里的调用要切出来
    # 模型会思考（Qwen3 一类）时是 prompt_thinking 说的提示词收尾（"tagged"、"opened"、"closed"）：开头的思考放进
    # reasoning_content；不切思考时 None
    reasoning: str | None = None

    def parser(self, uid: int) -> _Splitter:
        """第 uid 个回答的切分器。调用的 id 是 call_<uid>_<k>：一个服务里不会重复。"""
        return _splitter(self.reasoning, self.tools, uid)

    def finish_reason(self, reason: str | None, parser: _Splitter) -> str | None:
        if self.tools is None or parser.tools is None:
            return reason
        return self.tools.finish_reason(reason, parser.tools)

@dataclass
class _Splitter:
    """一个回答的切分：先切出开头的思考，剩下的再切出工具调用；两样都不切时文字原样是内容。"""

    reasoning: ReasoningParser | None
    tools: ToolCallParser | None
    thinking: int = 0  # 喂进来时思考还没写完的回复数：一条回复一个 token
    pending: List[Dict[str, Any]] = field(default_factory=list)  # 文字还扣在切分器里的 token（logprobs 的项）

    @property
    def reasoning_tokens(self) -> int:
        """思考用了几个 token（usage 的 reasoning_tokens）：到 </think> 为止，包括它。"""
        return self.thinking if self.reasoning is not None and self.reasoning.thought else 0

def _splitter(reasoning: str | None, tools: ToolCalls | None, uid: int) -> _Splitter:
    return _Splitter(ReasoningParser(reasoning == "opened") if reasoning is not None else None,
                     tools.parser(f"call_{uid}") if tools is not None else None)

def _split(parser: _Splitter, text: str, finished: bool) -> Tuple[str, str, List[Dict[str, Any]]]:
    """一条回复的新文字 → (思考, 内容, 这一段里写完的调用)；回答结束时把扣着的也交出来。非流式也一条回复一条
    回复地喂：切出来的和整段喂一次相同，还能数出思考的 token。"""
    thought, content, calls = "", text, []
    if parser.reasoning is not None:
        parser.thinking += parser.reasoning.state != "content"
        thought, content = parser.reasoning.feed(text)
        if finished:
            more_thought, more = parser.reasoning.finish()
            thought, content = thought + more_thought, content + more
    if parser.tools is not None:
        content, calls = parser.tools.feed(content)
        if finished:
            rest, more_calls = parser.tools.finish()
            content, calls = content + rest, calls + more_calls
    return thought, content, calls

def _split_reply(parser: _Splitter, ack: UserReply, top: int) \
        -> Tuple[str, str, List[Dict[str, Any]], List[Dict[str, Any]] | None]:
    """_split 一条回复，再把它带来的 token（对话接口 logprobs.content 的项，每个位置另给 top 个；没要 logprobs 时
    是 None）分给内容：内容只拿写出它的 token。回复写了思考或调用、或者算进了思考（</think> 那一条）却没写内容，
    它的 token 不给；什么都没写（切分器扣着半个 <tool_call>、</think> 之后的空行）就先存着，等内容出来一起给——
    所以 </think> 之后被丢掉的空行，它们的 token 也在内容的开头；回答结束时还存着的（没有文字的最后一个 token），
    也给内容。"""
    thinking = parser.reasoning_tokens
    thought, text, calls = _split(parser, ack.incremental_output, ack.finished)
    got = _chat_logprobs(ack.logprobs, top)
    if got is None:
        return thought, text, calls, None
    entries, parser.pending = parser.pending + got["content"], []
    if not text and (thought or calls or parser.reasoning_tokens > thinking):
        return thought, text, calls, []
    if not text and not ack.finished:
        parser.pending, entries = entries, []
    return thought, text, calls, entries

def _tool_call(call: Dict[str, Any], stream: bool) -> Dict[str, Any]:
    """OpenAI 形状的一个调用；流式的片段里多一个 index（这个回答的第几个调用）。"""
    out = {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}
    return {"index": call["index"], **out} if stream else out

def _stream(state: FrontendManager, uids: List[int], shape: _Shape, include_usage: bool) -> AsyncIterator[bytes]:
    """SSE 片段：每个回答各自的增量（带着自己的 index），各自一个 finish 片段；最后是 usage（要了的话）和 [DONE]。"""
    async def gen() -> AsyncIterator[bytes]:
        head = {**shape.head, "object": "chat.completion.chunk" if shape.chat else "text_completion"}
        if include_usage:  # OpenAI 的约定：要了 usage 时，其余每个片段也带着 usage 键，值为 null
            head["usage"] = None
        finals: List[UserReply | None] = [None] * len(uids)
        offsets = [len(t) for t in shape.echo] if shape.echo else [0] * len(uids)
        parsers = [shape.parser(uid) for uid in uids]

        def chunk(i: int, body: Dict[str, Any], logprobs: Any = None, finish: str | None = None) -> bytes:
            return _sse({**head, "choices": [{"index": i, **body, "logprobs": logprobs, "finish_reason": finish}]})

        frames = [chunk(i, {"delta": {"role": "assistant", "content": ""}}) for i in range(len(uids))] \
            if shape.chat else [chunk(i, {"text": t}) for i, t in enumerate(shape.echo or [])]
        async for replies in state.wait_for_replies(uids):
            for i, ack in replies:
                if ack.finish_reason == "error":
                    frames.append(_sse({"error": {"message": f"the server is shutting down: {state.dead}",
                                                  "type": "server_error", "param": None, "code": None}}))
                    yield b"".join(frames)
                    return
                # 没有新文字的回复（扣着半个字符、半个 <tool_call>）不发空片段；对数概率只跟着内容走（_split_reply）
                if shape.chat:
                    thought, text, calls, lp = _split_reply(parsers[i], ack, shape.top)
                    if thought:
                        frames.append(chunk(i, {"delta": {"reasoning_content": thought}}))
                    if text or lp:
                        frames.append(chunk(i, {"delta": {"content": text}},
                                            None if lp is None else {"content": lp, "refusal": None}))
                    frames += [chunk(i, {"delta": {"tool_calls": [_tool_call(c, stream=True)]}}) for c in calls]
                elif ack.incremental_output or ack.logprobs:
                    frames.append(chunk(i, {"text": ack.incremental_output},
                                        _completion_logprobs(ack.logprobs, shape.top, offsets[i])))
                if ack.finished:
                    finals[i] = ack
                    frames.append(chunk(i, {"delta": {}} if shape.chat else {"text": ""},
                                        finish=shape.finish_reason(ack.finish_reason, parsers[i])))
            yield b"".join(frames)  # 这次醒来拿到的几条回复，合成一次写出
            frames = []
        if include_usage:  # OpenAI 的约定：最后多一个 choices 为空、只带 usage 的片段
            thinking = sum(p.reasoning_tokens for p in parsers)
            frames.append(_sse({**head, "choices": [], "usage": _usage([r for r in finals if r], shape.n, thinking)}))
        yield b"".join(frames) + b"data: [DONE]\n\n"

    return gen()

def _response(groups: List[List[UserReply]], shape: _Shape) -> Dict[str, Any]:
    """非流式的完整响应：每个回答的文字接起来，logprobs 接起来；usage 见 _usage。"""
    choices, thinking = [], 0
    for i, replies in enumerate(groups):
        last = replies[-1]
        choice: Dict[str, Any] = {"index": i, "finish_reason": last.finish_reason}
        if shape.chat:
            parser = shape.parser(last.uid)
            pieces = [_split_reply(parser, r, shape.top) for r in replies]
            thought, content, calls = ("".join(p[0] for p in pieces), "".join(p[1] for p in pieces),
                                       [c for p in pieces for c in p[2]])
            entries = None if last.logprobs is None else [e for p in pieces for e in p[3] or []]
            thinking += parser.reasoning_tokens
            choice["finish_reason"] = shape.finish_reason(last.finish_reason, parser)
            message: Dict[str, Any] = {"role": "assistant", "content": (content or None) if calls else content}
            if thought:  # 只在真有思考时才有这个键：不思考的回答和第 15 章的一字不差
                message["reasoning_content"] = thought
            if calls:
                message["tool_calls"] = [_tool_call(c, stream=False) for c in calls]
            choice["message"] = message
            choice["logprobs"] = None if entries is None else {"content": entries, "refusal": None}
        else:
            echo = shape.echo[i] if shape.echo else ""
            choice["text"] = echo + "".join(r.incremental_output for r in replies)
            entries = None if last.logprobs is None else [e for r in replies for e in r.logprobs or []]
            choice["logprobs"] = _completion_logprobs(entries, shape.top, len(echo))
        choices.append(choice)
    return {**shape.head, "object": "chat.completion" if shape.chat else "text_completion", "choices": choices,
            "usage": _usage([g[-1] for g in groups], shape.n, thinking)}


class ClientGone(Exception):
    """客户端在回复之前断开了：请求已经中止，没有人再收回复（app 回一个 499，不打印 traceback）。"""


class APIError(Exception):
    """回给客户端的错误，OpenAI 的格式：{"error": {"message", "type", "param", "code"}}。"""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code

    def response(self) -> JSONResponse:
        body = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return JSONResponse({"error": body}, status_code=self.status)


app = FastAPI(title="minisgl")

@app.exception_handler(APIError)
async def _api_error(request: Request, e: APIError) -> JSONResponse:
    return e.response()

@app.exception_handler(ClientGone)
async def _client_gone(request: Request, e: ClientGone) -> Response:
    return Response(status_code=499)  # nginx 的"客户端关闭了连接"：没有人收，只为日志里少一段 traceback

@app.exception_handler(RequestValidationError)
async def _validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
    """坏的 JSON、类型不对的字段：FastAPI 默认回 422 和它自己的格式；改成 OpenAI 的 400。"""
    errors = e.errors()
    unknown = [err for err in errors if err.get("type") == "extra_forbidden"]  # 不认识的字段最该先说
    err = unknown[0] if unknown else errors[0]
    if err.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {err.get('ctx', {}).get('error', '')}").response()
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    where = ".".join(loc) or "body"
    if where == "body" and "json" not in request.headers.get("content-type", ""):  # curl -d 默认是表单的类型
        return APIError(400, "the request body must be a JSON object, sent with the header "
                             "Content-Type: application/json").response()
    if unknown:
        return APIError(400, f"{where} is not supported by this server", param=loc[0]).response()
    cause = err.get("ctx", {}).get("error")
    if isinstance(cause, _BodyError):  # 整个请求体的检查：位置在它自己手里，不在 loc 里
        return APIError(400, str(cause), param=cause.where.split(".")[0]).response()
    msg = str(err.get("msg")).removeprefix("Value error, ")  # 我们自己的检查（field_validator）抛的 ValueError
    return APIError(400, f"{where}: {msg}", param=loc[0] if loc else None).response()

@app.exception_handler(HTTPException)
async def _http_error(request: Request, e: HTTPException) -> JSONResponse:
    return APIError(e.status_code, str(e.detail), type="invalid_request_error").response()

class _CheckApiKey:
    """--api-key：除 /health、/metrics 外都要带 Authorization: Bearer <key>。

    纯 ASGI 中间件，原样转交 receive：Starlette 的 @app.middleware("http")（BaseHTTPMiddleware）会包一层
    receive，请求处理里的 request.is_disconnected() 就再也看不到客户端断开了。
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        key = get_state().config.api_key if scope["type"] == "http" else None
        if key and scope["path"] not in ("/health", "/metrics"):
            scheme, _, given = dict(scope["headers"]).get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), key.encode()):  # 方案名不分大小写
                response = APIError(401, "invalid or missing API key (send the header Authorization: Bearer <key>)",
                                    type="authentication_error", code="invalid_api_key").response()
                return await response(scope, receive, send)
        await self.app(scope, receive, send)

app.add_middleware(_CheckApiKey)


@app.post("/v1/chat/completions")
async def v1_chat_completions(req: ChatCompletionRequest, request: Request):
    tools = _tools(req)
    if req.messages and req.prompt:
        raise APIError(400, "give 'messages' or 'prompt', not both", param="prompt")
    if req.messages:
        text: str | List[Dict[str, Any]] = [m.to_template() for m in req.messages]
    elif tools is not None:
        raise APIError(400, "tools need 'messages': a plain 'prompt' does not go through the chat template",
                       param="tools")
    elif req.prompt:
        text = req.prompt
    else:
        raise APIError(400, "give a non-empty 'messages' list (or a 'prompt')", param="messages")
    if req.modalities not in (None, ["text"]):
        raise APIError(400, f"modalities={req.modalities} is not supported: only ['text']", param="modalities")
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    sp = _sampling_params(req, max_tokens, (req.top_logprobs or 0) if req.logprobs else None, get_state().vocab_size)
    if req.continue_final_message:  # 回答接着最后一条消息的文字写：它是回答的正文，不切思考
        if not (req.messages and text[-1]["role"] == "assistant" and text[-1]["content"].strip()):
            raise APIError(400, "continue_final_message needs the last message to be an assistant message with text "
                                "to continue", param="continue_final_message")
        if sp.grammar is not None:
            raise APIError(400, "continue_final_message cannot be combined with response_format, regex, ebnf or a "
                                "forced tool call: the grammar would start in the middle of the answer",
                           param="continue_final_message")
    if req.reasoning_effort == "none":  # 选项里关掉思考：_generate 套模板时、下面切思考时用的都是它
        if not req.messages:
            raise APIError(400, "reasoning_effort 'none' needs 'messages': a plain 'prompt' does not go through the "
                                "chat template", param="reasoning_effort")
        req.chat_template_kwargs = await _thinking_off(req.chat_template_kwargs or {}, "reasoning_effort")
    thinking = await _thinking(req.chat_template_kwargs or {}) \
        if req.separate_reasoning and req.messages and not req.continue_final_message else None
    return await _generate(req, request, [text], _reasoned(sp, thinking), chat=True, tools=tools, reasoning=thinking)

async def _thinking_off(options: Dict[str, Any], param: str) -> Dict[str, Any]:
    """思考力度 none：对话模板的选项里关掉思考（Qwen3 的 enable_thinking: false）。模板得真能关上，也就是提示词以
    一段关上的思考收尾；会思考却关不上的模板（替模型写好 <think> 的那种）回 400，不悄悄照想不误。"""
    if options.get("enable_thinking") is True:
        raise APIError(400, f"{param} 'none' contradicts chat_template_kwargs enable_thinking: true", param=param)
    off = {**options, "enable_thinking": False}
    if await _thinking(off) not in (None, "closed"):
        raise APIError(400, f"{param} 'none': this model's chat template cannot turn its thinking off", param=param)
    return off

async def _thinking(options: Dict[str, Any]) -> str | None:
    """模型会思考时（模板里有 <think>）提示词怎样收尾（prompt_thinking：回答怎样切、语法等不等思考）；不思考时
    None。收尾可能取决于请求的 chat_template_kwargs，所以按它问；分词器还没加载时（服务的第一个这样的请求）要一秒
    上下，放进线程里，不卡住别的请求，之后套一次模板不到一毫秒，结果还有缓存，就地做。"""
    path = str(get_state().config.model_path)
    if not template_thinks(path):
        return None
    key = json.dumps(options, sort_keys=True)
    return prompt_thinking(path, key) if template_tokenizer_loaded() else \
        await asyncio.to_thread(prompt_thinking, path, key)

def _reasoned(sp: SamplingParams, thinking: str | None) -> SamplingParams:
    """受语法约束的请求发给会思考的模型：让语法等思考写完再管（ThinkingGrammar），思考照样切进 reasoning_content。
    提示词里的思考已经关上（closed）时模型不再思考，语法从第一个 token 管起。"""
    if thinking in (None, "closed") or sp.grammar is None:
        return sp
    return replace(sp, reasoning=thinking)

def _tools(req: ChatCompletionRequest | ResponsesRequest) -> ToolCalls | None:
    """tools 和 tool_choice → ToolCalls；没有工具、或 tool_choice 是 none（这时工具也不进提示词）时 None。
    没有工具时 auto 和 none 一样（没什么可调的）；必须调用却没有工具，是 400。"""
    tools, choice, parallel = req.tool_view()
    if not tools:
        if choice not in ("none", "auto"):
            raise APIError(400, "a forced tool_choice needs a non-empty tools list", param="tool_choice")
        return None
    if choice == "none":
        return None
    names = [t.function.name for t in tools]
    if len(set(names)) < len(names):
        raise APIError(400, "two tools have the same function name", param="tools")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise APIError(400, f"tool_choice names {choice.function.name!r}, which is not in tools", param="tool_choice")
    if not template_writes_tool_calls(str(get_state().config.model_path)):
        raise APIError(400, "tools need a chat template that shows the model the tools and has it answer with "
                            "<tool_call>{...}</tool_call> (Qwen2.5, Qwen3, Hermes, ...); this model's does not",
                       param="tools")
    return ToolCalls([t.model_dump(exclude_none=True) for t in tools], forced=choice != "auto",
                     named=isinstance(choice, NamedToolChoice), parallel=parallel)

@app.post("/v1/completions")
async def v1_completions(req: CompletionRequest, request: Request):
    """补全接口：原样的提示词（一个或几个，文字或 token id），不套对话模板；max_tokens 默认 16（OpenAI 的默认值）。"""
    state = get_state()
    if req.suffix is not None:
        raise APIError(400, "suffix is not supported: this server does not do fill-in-the-middle", param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise APIError(400, f"best_of={req.best_of} is not supported: this server returns all n={req.n} samples "
                            f"and does not pick the best ones", param="best_of")
    if req.logprobs is not None and not 0 <= req.logprobs <= 5:
        raise APIError(400, f"logprobs={req.logprobs} is invalid: it must be in 0..5", param="logprobs")
    if req.echo and req.logprobs is not None:
        raise APIError(400, "echo with logprobs needs the prompt's logprobs, which this server does not compute",
                       param="echo")
    prompts = _prompts(req.prompt, state.vocab_size)
    if req.echo and not all(isinstance(p, str) for p in prompts):
        raise APIError(400, "echo needs text prompts: this server does not turn token ids back into text here",
                       param="echo")
    sp = _sampling_params(req, req.max_tokens if req.max_tokens is not None else 16, req.logprobs, state.vocab_size)
    return await _generate(req, request, prompts, sp, chat=False)

def _prompts(prompt: str | List[str] | List[int] | List[List[int]], vocab_size: int) -> List[str | List[int]]:
    """补全接口的 prompt → 提示词的列表：一个字符串、几个字符串、一串 token id，或者几串 token id。"""
    prompts: List[Any] = [prompt] if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) \
        else list(prompt)
    if not prompts or not all(prompts):
        raise APIError(400, "the prompt is empty", param="prompt")
    for p in prompts:
        if not isinstance(p, str) and not all(0 <= t < vocab_size for t in p):
            raise APIError(400, f"a token-id prompt has ids outside the vocabulary 0..{vocab_size - 1}",
                           param="prompt")
    return prompts

def _max_tokens_param(req: ChatCompletionRequest | CompletionRequest | ResponsesRequest) -> str:
    """客户端用哪个字段给的输出上限：Responses API 是 max_output_tokens，新版对话接口是 max_completion_tokens。"""
    if isinstance(req, ResponsesRequest):
        return "max_output_tokens"
    return "max_completion_tokens" if getattr(req, "max_completion_tokens", None) is not None else "max_tokens"

async def _generate(req: ChatCompletionRequest | CompletionRequest, request: Request,
                    prompts: List[Any], sp: SamplingParams, chat: bool, tools: ToolCalls | None = None,
                    reasoning: str | None = None):
    """每个提示词 n 个请求（给了 seed 时，第 j 个回答的 seed 是 seed + j），等第一条回复，然后流式或一次性地回答。
    tools：对话模板里写上这些工具，回答里的调用切出来；reasoning：回答开头的思考切出来。"""
    _check_stream_options(req)
    stops = _stop(req)  # 先查完：坏请求不登记任何 uid
    await _check_request_grammar(sp, req)
    state = get_state()
    n = req.n
    uids = state.new_users(len(prompts) * n)
    options = (req.chat_template_kwargs or {}) if isinstance(req, ChatCompletionRequest) else {}
    if isinstance(req, ChatCompletionRequest) and req.continue_final_message:
        options = {**options, "continue_final_message": True}
    if tools is not None:
        options = {**options, "tools": tools.tools}
    sent = 0
    try:
        for k, uid in enumerate(uids):
            p, j = divmod(k, n)
            await state.send_one(TokenizeMsg(uid=uid, text=prompts[p], sampling_params=nth_sample(sp, j),
                                             chat_options=options, stop=stops))
            sent += 1
    except BaseException:  # 发到一半失败（服务在关闭）或被取消：发出去的要中止，没发出的登记要忘掉
        asyncio.create_task(state.abort_users(uids[:sent]))
        for uid in uids[sent:]:
            state._forget(uid)
        raise
    default = isinstance(req, CompletionRequest) and req.max_tokens is None  # 客户端没给：说出 16 从哪来
    await state.until_disconnected(state.first_replies(
        uids, param="messages" if chat else "prompt", max_tokens_param=_max_tokens_param(req),
        max_tokens_note=" (the completions API's default: the request gives none)" if default else ""), uids, request)
    head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uids[0]}", "created": int(time.time()),
            "model": state.config.served_model_name}
    top = (req.top_logprobs or 0) if isinstance(req, ChatCompletionRequest) else (req.logprobs or 0)
    echo = [prompts[k // n] for k in range(len(uids))] if isinstance(req, CompletionRequest) and req.echo else None
    shape = _Shape(head, chat, n, top, echo, tools, reasoning)
    if req.stream:
        include_usage = req.stream_options is not None and req.stream_options.include_usage
        return StreamingResponse(state.stream_with_cancellation(_stream(state, uids, shape, include_usage), uids),
                                 media_type="text/event-stream")
    groups = await state.collect_with_cancellation(uids, request)
    if any(g[-1].finish_reason == "error" for g in groups):
        raise APIError(503, f"the server is shutting down: {state.dead}", type="server_error")
    return _response(groups, shape)


class GenerateRequest(_Body):
    prompt: str
    max_tokens: int = 16
    ignore_eos: bool = False

@app.post("/generate")
async def generate(req: GenerateRequest, request: Request):
    """最简单的接口：贪心生成，每段文字一条 data: "..."（JSON 字符串），最后 data: [DONE]。"""
    if not req.prompt:
        raise APIError(400, "the prompt is empty", param="prompt")
    try:
        sp = SamplingParams(max_tokens=req.max_tokens, ignore_eos=req.ignore_eos)
    except ValueError as e:
        raise APIError(400, str(e), param=str(e).split("=")[0]) from None
    state = get_state()
    uids = state.new_users()
    await state.send_one(TokenizeMsg(uid=uids[0], text=req.prompt, sampling_params=sp))
    await state.until_disconnected(state.first_replies(uids, param="prompt"), uids, request)

    async def pieces() -> AsyncIterator[bytes]:
        async for replies in state.wait_for_replies(uids):
            yield b"".join(_sse(ack.incremental_output) for _, ack in replies)
        yield b"data: [DONE]\n\n"

    return StreamingResponse(state.stream_with_cancellation(pieces(), uids), media_type="text/event-stream")

def _model_card(state: FrontendManager) -> Dict[str, Any]:
    c = state.config
    return {"id": c.served_model_name, "object": "model", "created": 0, "owned_by": "minisgl",
            "root": str(c.model_path), "max_model_len": state.max_seq_len}

@app.get("/v1/models")
async def v1_models():
    return {"object": "list", "data": [_model_card(get_state())]}

@app.get("/v1/models/{model_id:path}")
async def v1_model(model_id: str):
    state = get_state()
    if model_id != state.config.served_model_name:
        raise APIError(404, f"the model {model_id!r} does not exist: this server serves "
                            f"{state.config.served_model_name!r}", param="model", code="model_not_found")
    return _model_card(state)

@app.get("/health")
async def health():
    state = get_state()
    if state.dead is not None:
        return APIError(503, f"the server is shutting down: {state.dead}", type="server_error").response()
    return {"status": "ok"}

@app.get("/metrics")
async def metrics():
    state = get_state()
    await state.wait_for_stats()  # 还没有请求时也要开始收调度器的统计
    return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")


class ResponsesTool(FunctionDef):
    """Responses API 的一个函数工具：和对话接口的 Tool 一样，只是摊平了——FunctionDef 的字段（名字、说明、参数）
    和 type 在同一层。"""

    type: Literal["function"]

    @model_validator(mode="before")
    @classmethod
    def _functions_only(cls, value: Any) -> Any:  # 不然 web_search 之类说的是"缺 name"
        if isinstance(value, dict) and value.get("type") != "function":
            raise ValueError(f"type {value.get('type')!r} is not supported: only function tools")
        return value

class ResponsesToolChoice(_Strict):
    type: Literal["function"]
    name: str

class ResponsesTextFormat(_Strict):
    """Responses API 的输出格式：和 response_format 一样三种，只是 json_schema 的名字和 schema 摊平在这一层。"""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    schema_: Dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None

class ResponsesReasoning(_Strict):
    """Responses API 的 reasoning：和对话接口的 reasoning_effort 一样只有 none 和 medium 两档；思考的摘要我们不写
    （reasoning 项里是思考的原文），summary 只能不给。"""

    effort: Literal["none", "medium"] | None = None
    summary: None = None

class ResponsesText(_Strict):
    format: ResponsesTextFormat | None = None
    verbosity: Literal["medium"] | None = None  # GPT-5 的回答详略：我们只有模型自己的详略，也就是默认的 medium

    def response_format(self) -> ResponseFormat | None:
        """换成对话接口的 response_format：_grammar 只有一条路。"""
        f = self.format
        if f is None or f.type != "json_schema":
            return None if f is None else ResponseFormat(type=f.type)
        if f.name is None or f.schema_ is None:
            raise APIError(400, 'text.format of type "json_schema" needs "name" and "schema"', param="text")
        return ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(
            name=f.name, schema=f.schema_, description=f.description, strict=f.strict))

class ResponsesRequest(_OpenAIRequest):
    """/v1/responses 的请求：文字进、文字出，加上函数工具、思考和结构化输出（附录）。多轮对话两种写法：客户端把上一轮
    的输出项（reasoning、function_call……）和工具的结果放进 input，或者只发新的项、用 previous_response_id 接上服务
    记下的对话。"""

    input: str | List[Dict[str, Any]]  # 一句话，或者 [{"role": ..., "content": 文字或 input_text 片段}, ...]
    instructions: str | None = None  # 放在最前面的 system 消息
    max_output_tokens: int | None = None
    temperature: float = 1.0
    top_p: float | None = None
    stream: bool | None = False  # null 和 false 一样（sglang-router 转发时是 null）
    text: ResponsesText | None = None  # 输出的格式：文字（默认）、json_object 或 json_schema（约束解码）
    truncation: Literal["disabled"] | None = None  # "auto" 会悄悄丢掉对话的开头：不支持
    # sglang-router 转发这个接口时带上的字段（附录）：三个采样参数照办，priority 只认默认的 0
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    priority: Literal[0] = 0
    tools: List[ResponsesTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ResponsesToolChoice | None = None
    parallel_tool_calls: bool = True
    # 响应里还要带上的东西（OpenAI Agents SDK 每次都发这个字段，通常是空的）。reasoning.encrypted_content 是给不存
    # 响应的客户端送回思考用的；我们的 reasoning 项把思考原样放在 content 里，送回它就行：照收，不用另给。
    # message.output_text.logprobs：message 项的文字带上每个 token 的对数概率
    include: List[Literal["reasoning.encrypted_content", "message.output_text.logprobs"]] | None = None
    top_logprobs: int | None = None  # 0..20：每个位置另给最可能的几个（要和上面的 logprobs 一起给）
    previous_response_id: str | None = None  # 接着这个响应往下说：服务记得它的整段对话（下面的 ResponseStore）
    chat_template_kwargs: Dict[str, Any] | None = None  # 和对话接口的同名扩展一样：例如 {"enable_thinking": false}
    reasoning: ResponsesReasoning | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value: Dict[str, Any] | None) -> Dict[str, Any] | None:
        return _template_variables(value)

    def tool_view(self) -> Tuple[List[Tool], Any, bool]:
        """工具换成对话接口的形状，_tools 和 _grammar 两个接口共用。"""
        tools = [Tool(type="function", function=FunctionDef(**t.model_dump(exclude={"type"}, exclude_none=True)))
                 for t in self.tools or []]
        choice = self.tool_choice
        if isinstance(choice, ResponsesToolChoice):
            choice = NamedToolChoice(type="function", function=ToolName(name=choice.name))
        return tools, choice or "auto", self.parallel_tool_calls

    def input_items(self) -> List[Dict[str, Any]]:
        return [{"role": "user", "content": self.input}] if isinstance(self.input, str) else self.input

    def messages(self, items: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """对话的项（之前记下的，加上这次的 input）→ 对话模板的消息；instructions 放在最前面，只用这一次的。"""
        out: List[Dict[str, Any]] = [{"role": "system", "content": self.instructions}] if self.instructions else []
        for item in items:
            if item.get("type") in ("reasoning", "function_call", "function_call_output"):  # 上一轮的输出项和结果
                turn = _tool_turn(item, out)
                if turn is not None:
                    out.append(turn)
                continue
            content, role = item.get("content"), item.get("role")
            if item.get("type", "message") != "message" or role not in ("system", "developer", "user", "assistant"):
                raise APIError(400, f"input items must be text messages, got {json.dumps(item)[:80]}", param="input")
            if isinstance(content, list):
                if not all(isinstance(p, dict) and p.get("type") in ("input_text", "output_text")
                           and isinstance(p.get("text"), str) for p in content):
                    raise APIError(400, "only input_text content parts are supported", param="input")
                content = "".join(p["text"] for p in content)
            if not isinstance(content, str):
                raise APIError(400, "a message's content must be text", param="input")
            if role == "assistant" and out and out[-1]["role"] == "assistant" and out[-1]["content"] == "" \
                    and "tool_calls" not in out[-1]:  # 紧跟在它的思考（reasoning 项）后面：同一条 assistant 消息
                out[-1]["content"] = content
                continue
            out.append({"role": "system" if role == "developer" else role, "content": content})
        return out

def _tool_turn(item: Dict[str, Any], out: List[Dict[str, Any]]) -> Dict[str, Any] | None:
    """input 里上一轮的输出项 → 模板的消息：reasoning → 一条 assistant 消息的 reasoning_content；function_call →
    assistant 消息的一个 tool_calls（紧跟在 assistant 消息后面时并进去，返回 None）；function_call_output → tool
    消息。形状不对是 400。"""
    where = json.dumps(item, ensure_ascii=False)[:80]
    if item["type"] == "reasoning":  # 思考在 reasoning_text 片段里；别家的（只有摘要、加密的内容）算没有思考
        parts = item.get("content") or []
        if not (isinstance(parts, list) and all(isinstance(p, dict) and p.get("type") == "reasoning_text"
                                                and isinstance(p.get("text"), str) for p in parts)):
            raise APIError(400, f"the content of input item {where} must be reasoning_text parts", param="input")
        return {"role": "assistant", "content": "", "reasoning_content": "".join(p["text"] for p in parts)}
    call_id = item.get("call_id")
    if not isinstance(call_id, str):
        raise APIError(400, f"input item {where} needs a call_id", param="input")
    if item["type"] == "function_call_output":
        output = item.get("output")
        if isinstance(output, list) and all(isinstance(p, dict) and p.get("type") == "input_text"
                                            and isinstance(p.get("text"), str) for p in output):
            output = "".join(p["text"] for p in output)
        if not isinstance(output, str):
            raise APIError(400, f"the output of input item {where} must be text", param="input")
        return {"role": "tool", "tool_call_id": call_id, "content": output}
    arguments = json_or_none(item.get("arguments")) if isinstance(item.get("arguments"), str) else None
    if not isinstance(item.get("name"), str) or not isinstance(arguments, dict):
        raise APIError(400, f"input item {where} needs a name and arguments that are a JSON object", param="input")
    call = {"id": call_id, "type": "function", "function": {"name": item["name"], "arguments": arguments}}
    if out and out[-1]["role"] == "assistant":  # 一轮里的几个调用（和它前面的思考、文字）是一条 assistant 消息
        out[-1].setdefault("tool_calls", []).append(call)
        return None
    return {"role": "assistant", "content": "", "tool_calls": [call]}

def _response_object(req: ResponsesRequest, rid: str, created: int, model: str, last: UserReply | None,
                     output: List[Dict[str, Any]], reasoning_tokens: int = 0) -> Dict[str, Any]:
    """Responses API 的响应对象。last 是最后一条回复：None 时是刚开始（还没有输出）。output 是 _Output 建好的项。"""
    status = "in_progress" if last is None else "incomplete" if last.finish_reason == "length" else "completed"
    choice = req.tool_choice if req.tool_choice is not None else "auto" if req.tools else "none"
    obj: Dict[str, Any] = {
        "id": f"resp_{rid}", "object": "response", "created_at": created, "status": status, "model": model,
        "output": [] if last is None else output,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "temperature": req.temperature, "top_p": 1.0 if req.top_p is None else req.top_p,
        "parallel_tool_calls": req.parallel_tool_calls, "tool_choice": choice if isinstance(choice, str)
        else choice.model_dump(), "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
        "text": {"format": req.text.format.model_dump(by_alias=True, exclude_none=True)
                 if req.text is not None and req.text.format is not None else {"type": "text"}},
        "top_logprobs": req.top_logprobs, "store": req.store is not False,
        "previous_response_id": req.previous_response_id, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None, "usage": None}
    if last is not None:
        obj["usage"] = {"input_tokens": last.prompt_tokens, "output_tokens": last.completion_tokens,
                        "total_tokens": last.prompt_tokens + last.completion_tokens,
                        "input_tokens_details": {"cached_tokens": last.cached_tokens},
                        "output_tokens_details": {"reasoning_tokens": reasoning_tokens}}
    return obj

_TEXT_ITEMS = {"reasoning": ("rs", "reasoning_text"), "message": ("msg", "output_text")}  # id 的前缀，文字片段的类型

def _text_item(kind: str, rid: str, text: str | None, status: str,
               logprobs: List[Dict[str, Any]] | None = None) -> Dict[str, Any]:
    """思考（reasoning 项）或文字（message 项）。text 是 None 时（刚加入、还没写）content 是空的；logprobs：message
    项文字的每个 token（对话接口 logprobs.content 的形状），没要时是空的。"""
    if kind == "reasoning":
        content = [] if text is None else [{"type": "reasoning_text", "text": text}]
        return {"type": "reasoning", "id": f"rs_{rid}", "summary": [], "content": content, "status": status}
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [],
                                        "logprobs": logprobs or []}]
    return {"type": "message", "id": f"msg_{rid}", "status": status, "role": "assistant", "content": content}

def _function_call_item(rid: str, call: Dict[str, Any], status: str) -> Dict[str, Any]:
    """一个调用的输出项。id 是这个输出项的名字；call_id 是调用的名字，客户端送回结果时用它对上号。"""
    return {"type": "function_call", "id": f"fc_{rid}_{call['index']}", "call_id": call["id"], "name": call["name"],
            "arguments": call["arguments"] if status == "completed" else "", "status": status}

class _Output:
    """一个回答的输出项，一条回复一条回复地建起来：思考是 reasoning 项，文字是 message 项，每个调用一个
    function_call 项，按出现的先后排 output_index。feed 返回这条回复引出的事件（流式时发出去，非流式时丢掉）；
    回答结束后 items 就是响应的 output。什么也没写的回答有一个空的 message 项。
    top：要了 logprobs 时每个位置另给几个（None：没要）。对数概率只给 message 项的文字，怎么分见 _split_reply（对话
    接口的 logprobs.content 也这样分）。"""

    def __init__(self, rid: str, parser: _Splitter, event: Callable[..., bytes], top: int | None = None) -> None:
        self.rid, self.parser, self.event, self.top = rid, parser, event, top
        self.items: List[Dict[str, Any]] = []
        self.open: Dict[str, int] = {}  # 还在写的文字项（reasoning / message）→ 它的 output_index
        self.texts: Dict[str, str] = {}
        self.logprobs: List[Dict[str, Any]] = []  # message 项的文字的每个 token（对话接口的形状）

    def feed(self, ack: UserReply) -> List[bytes]:
        thought, text, calls, entries = _split_reply(self.parser, ack, self.top or 0)
        frames = self._write("reasoning", thought) if thought else []
        if text or calls:  # 思考写完了
            frames += self._close("reasoning")
        if text:
            frames += self._write("message", text, entries or [])
        for call in calls:  # 写完一个调用：它的输出项从加入到完成，参数一次给全
            at = dict(item_id=f"fc_{self.rid}_{call['index']}", output_index=len(self.items))
            self.items.append(_function_call_item(self.rid, call, "completed"))
            frames += [self.event("response.output_item.added", output_index=at["output_index"],
                                  item=_function_call_item(self.rid, call, "in_progress")),
                       self.event("response.function_call_arguments.delta", **at, delta=call["arguments"]),
                       self.event("response.function_call_arguments.done", **at, arguments=call["arguments"]),
                       self.event("response.output_item.done", output_index=at["output_index"],
                                  item=self.items[-1])]
        if ack.finished:
            if not self.items:
                frames += self._write("message", "")
            frames += self._close("reasoning") + self._close("message")
        return frames

    def _where(self, kind: str) -> Dict[str, Any]:
        return dict(item_id=f"{_TEXT_ITEMS[kind][0]}_{self.rid}", output_index=self.open[kind], content_index=0)

    def _text_event(self, kind: str, what: str, logprobs: List[Dict[str, Any]] = (), **body: Any) -> bytes:
        """文字项的 delta / done 事件；response.output_text.* 还带这一段的 logprobs（没要时是空的），事件里的
        每一项只有 token、logprob 和同样两个键的 top_logprobs（OpenAI 事件的形状）。"""
        extra = {"logprobs": [{"token": e["token"], "logprob": e["logprob"], "top_logprobs": [
            {"token": t["token"], "logprob": t["logprob"]} for t in e["top_logprobs"]]} for e in logprobs]} \
            if kind == "message" else {}
        return self.event(f"response.{_TEXT_ITEMS[kind][1]}.{what}", **self._where(kind), **body, **extra)

    def _write(self, kind: str, delta: str, logprobs: List[Dict[str, Any]] = ()) -> List[bytes]:
        """往一个文字项里写一段（message 项连同这一段的 logprobs）；还没有这一项时先加入它（output_item.added、
        content_part.added）。"""
        frames = []
        if kind not in self.open:
            self.open[kind], self.texts[kind] = len(self.items), ""
            self.items.append(_text_item(kind, self.rid, None, "in_progress"))
            frames += [self.event("response.output_item.added", output_index=self.open[kind], item=self.items[-1]),
                       self.event("response.content_part.added", **self._where(kind),
                                  part=_text_item(kind, self.rid, "", "in_progress")["content"][0])]
        self.texts[kind] += delta
        if kind == "message":
            self.logprobs += logprobs
        return frames + ([self._text_event(kind, "delta", logprobs, delta=delta)] if delta else [])

    def _close(self, kind: str) -> List[bytes]:
        """一个文字项写完了：它的 done 事件（文字、片段、项）；没有这一项、或已经关了时什么也不发。"""
        if kind not in self.open:
            return []
        k, text = self.open[kind], self.texts[kind]
        self.items[k] = _text_item(kind, self.rid, text, "completed", self.logprobs if kind == "message" else None)
        frames = [self._text_event(kind, "done", self.logprobs if kind == "message" else (), text=text),
                  self.event("response.content_part.done", **self._where(kind), part=self.items[k]["content"][0]),
                  self.event("response.output_item.done", output_index=k, item=self.items[k])]
        del self.open[kind]
        return frames

@app.post("/v1/responses")
async def v1_responses(req: ResponsesRequest, request: Request):
    """OpenAI 的 Responses API，文字部分：非流式一个 response 对象；流式是一串带名字的事件（event: 类型）。"""
    state = get_state()
    tools = _tools(req)
    items = _previous_items(req) + req.input_items()  # 这段对话到这次为止的项
    messages = req.messages(items)
    if not messages:
        raise APIError(400, "input is empty: give a string or at least one item", param="input")
    top = (req.top_logprobs or 0) if "message.output_text.logprobs" in (req.include or []) else None
    if req.top_logprobs is not None and top is None:
        raise APIError(400, 'top_logprobs needs include: ["message.output_text.logprobs"]', param="top_logprobs")
    sp = _sampling_params(req, req.max_output_tokens, top, state.vocab_size)  # type: ignore[arg-type]
    await _check_request_grammar(sp, req)  # 强制调用的 schema
    options = req.chat_template_kwargs or {}
    if req.reasoning is not None and req.reasoning.effort == "none":
        options = await _thinking_off(options, "reasoning")
    thinking = await _thinking(options)
    sp = _reasoned(sp, thinking)
    uids = state.new_users()
    await state.send_one(TokenizeMsg(uid=uids[0], text=messages, sampling_params=sp,
                                     chat_options={**options, "tools": tools.tools} if tools is not None else options))
    await state.until_disconnected(state.first_replies(uids, param="input", max_tokens_param=_max_tokens_param(req)),
                                   uids, request)
    rid, created, model = f"{_store.epoch}{uids[0]}", int(time.time()), state.config.served_model_name
    parser = _splitter(thinking, tools, uids[0])

    def finished(output: _Output, last: UserReply) -> Dict[str, Any]:
        """回答完了：响应对象，记下它和到这里为止的整段对话（store 不是 false 时）。"""
        done = _response_object(req, rid, created, model, last, output.items, parser.reasoning_tokens)
        return _remember(req, items + output.items, done)

    if not req.stream:
        replies = (await state.collect_with_cancellation(uids, request))[0]
        if replies[-1].finish_reason == "error":
            raise APIError(503, f"the server is shutting down: {state.dead}", type="server_error")
        output = _Output(rid, parser, lambda kind, **body: b"", top)
        for reply in replies:
            output.feed(reply)
        return finished(output, replies[-1])

    async def events() -> AsyncIterator[bytes]:
        seq = 0

        def event(kind: str, **body: Any) -> bytes:
            nonlocal seq
            seq += 1
            return f"event: {kind}\n".encode() + _sse({"type": kind, "sequence_number": seq - 1, **body})

        output = _Output(rid, parser, event, top)
        start = _response_object(req, rid, created, model, None, [])
        yield event("response.created", response=start) + event("response.in_progress", response=start)
        async for replies in state.wait_for_replies(uids):
            frames = []
            for _, ack in replies:
                if ack.finish_reason == "error":
                    yield event("error", code="server_error", message=f"the server is shutting down: {state.dead}",
                                param=None)
                    return
                frames += output.feed(ack)
                if ack.finished:
                    done = finished(output, ack)
                    frames.append(event(f"response.{done['status']}", response=done))
            yield b"".join(frames)

    return StreamingResponse(state.stream_with_cancellation(events(), uids), media_type="text/event-stream")


LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)  # 秒

@dataclass
class Metrics:
    """/metrics 的数：调度器最近一次推来的 SchedulerStats，加上 API Server 自己数的 token 和延迟。"""

    stats: SchedulerStats = field(default_factory=SchedulerStats)
    finished: Dict[str, int] = field(default_factory=dict)  # finish_reason → 请求数
    prompt_tokens: int = 0
    generation_tokens: int = 0
    latency_buckets: List[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))  # 累计：<= 上界的个数
    latency_sum: float = 0.0
    latency_count: int = 0  # 跑完的请求（客户端断开的 abort 只进 finished，没有端到端延迟）

    @property
    def ready(self) -> bool:
        """收到过调度器的统计了吗：KV 池至少有一页，真实的统计里三类页之和总是正的。"""
        s = self.stats
        return s.pages_used + s.pages_cached + s.pages_free > 0

    def left(self, n: int) -> None:
        """n 个请求的客户端没等到结束就走了：记作 abort（没有 token 数，也不进延迟直方图）。"""
        self.finished["abort"] = self.finished.get("abort", 0) + n

    def observe(self, reply: UserReply, seconds: float) -> None:
        reason = reply.finish_reason or "stop"
        self.finished[reason] = self.finished.get(reason, 0) + 1
        self.prompt_tokens += reply.prompt_tokens
        self.generation_tokens += reply.completion_tokens
        self.latency_sum += seconds
        self.latency_count += 1
        for i, bound in enumerate(LATENCY_BUCKETS):
            self.latency_buckets[i] += seconds <= bound

    def render(self) -> str:
        """Prometheus 的文本格式：# HELP、# TYPE，然后每行一个 名字{标签} 值。"""
        s, out = self.stats, []

        def metric(name: str, kind: str, doc: str, samples: List[str]) -> None:
            out.extend([f"# HELP minisgl_{name} {doc}", f"# TYPE minisgl_{name} {kind}", *samples])

        for name, value, doc in [
                ("num_running_requests", s.running, "Requests holding a slot (prefilling or decoding)"),
                ("num_waiting_requests", s.waiting, "Requests waiting for a slot"),
                ("kv_pages_used", s.pages_used, "KV pages in use by running requests (their own and the cached "
                                                "prefix pages they share)"),
                ("kv_pages_cached", s.pages_cached, "KV pages held only by the prefix cache (evictable)"),
                ("kv_pages_free", s.pages_free, "KV pages on the free list (used + cached + free = all pages)")]:
            metric(name, "gauge", doc, [f"minisgl_{name} {value}"])
        metric("prompt_tokens_total", "counter", "Prompt tokens of finished requests",
               [f"minisgl_prompt_tokens_total {self.prompt_tokens}"])
        metric("cached_tokens_total", "counter", "Prompt tokens found in the prefix cache (not prefilled again)",
               [f"minisgl_cached_tokens_total {s.cached_tokens}"])
        metric("generation_tokens_total", "counter", "Generated tokens of finished requests",
               [f"minisgl_generation_tokens_total {self.generation_tokens}"])
        metric("requests_finished_total", "counter", "Finished requests by finish reason",
               [f'minisgl_requests_finished_total{{reason="{r}"}} {n}' for r, n in sorted(self.finished.items())])
        count = self.latency_count
        metric("request_latency_seconds", "histogram", "End-to-end latency of finished requests",
               [f'minisgl_request_latency_seconds_bucket{{le="{b}"}} {n}'
                for b, n in zip(LATENCY_BUCKETS, self.latency_buckets)]
               + [f'minisgl_request_latency_seconds_bucket{{le="+Inf"}} {count}',
                  f"minisgl_request_latency_seconds_sum {self.latency_sum:.6f}",
                  f"minisgl_request_latency_seconds_count {count}"])
        return "\n".join(out) + "\n"


def _hf_config(model_path: str | Path) -> Dict[str, Any]:
    """模型目录里的 config.json（读不到就是空的）：model_type 和 architectures 从这里来。"""
    try:
        return json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}

@app.get("/get_model_info")
async def get_model_info():
    """SGLang 的同名接口：这个 worker 服务哪个模型。sglang-router 登记 worker 时来问。"""
    config = get_state().config
    hf = _hf_config(config.model_path)
    return {"model_path": str(config.model_path), "tokenizer_path": str(config.model_path),
            "served_model_name": config.served_model_name, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default",
            "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": hf.get("model_type"), "architectures": hf.get("architectures")}

_NOT_SHOWN = ("api_key", "zmq_", "tp_info")  # 密钥不往外说；ZMQ 地址只在本机进程之间有意义；tp_info 换成 tp_size

@app.get("/get_server_info")
async def get_server_info():
    """SGLang 的同名接口：启动参数（外加 SGLang 对同样东西的叫法）、调度器的实时统计、版本。"""
    state = get_state()
    await state.wait_for_stats()  # 服务刚起来时等调度器的第一条统计（第 15 章的 /metrics 也这样）
    config, m = state.config, state.metrics
    s = m.stats
    info: Dict[str, Any] = {}
    for f in fields(config):
        if not f.name.startswith(_NOT_SHOWN):
            value = getattr(config, f.name)
            info[f.name] = value if value is None or isinstance(value, (bool, int, float, str)) else str(value)
    info.update(tp_size=config.tp_info.size, dp_size=1, host=config.server_host, port=config.server_port,
                tokenizer_path=str(config.model_path), served_model_name=config.served_model_name,
                max_running_requests=config.max_running_req, max_prefill_tokens=config.max_extend_tokens,
                disable_radix_cache=config.cache_type != "radix",
                max_total_num_tokens=(s.pages_used + s.pages_cached + s.pages_free) * config.page_size)
    info["internal_states"] = [{"num_running_reqs": s.running, "num_waiting_reqs": s.waiting,
                                "kv_pages_used": s.pages_used, "kv_pages_cached": s.pages_cached,
                                "kv_pages_free": s.pages_free,
                                "cached_tokens": s.cached_tokens,
                                "prompt_tokens": m.prompt_tokens, "generation_tokens": m.generation_tokens}]
    info["version"] = __version__
    return info


MAX_STORED_RESPONSES = 1024  # 记住最近这么多个响应；更早的 previous_response_id 回 400


@dataclass
class _Stored:
    response: Dict[str, Any]  # 完成时的响应对象：GET 原样返回
    items: List[Dict[str, Any]]  # 对话到这个响应为止的全部项：之前的、这次 input 的、这次 output 的（不含 instructions）


class ResponseStore:
    """服务记住的响应（OpenAI 的 store，默认开着）：在 API 服务进程的内存里，至多 capacity 个，最久没用到的先忘；
    服务重启就都忘了。"""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.stored: OrderedDict[str, _Stored] = OrderedDict()
        self.epoch = secrets.token_hex(4)  # 响应 id 的前缀，每次启动不同：重启前拿到的 id 不会撞上重启后的响应

    def put(self, rid: str, stored: _Stored) -> None:
        self.stored[rid] = stored
        self.stored.move_to_end(rid)
        while len(self.stored) > self.capacity:
            self.stored.popitem(last=False)

    def get(self, rid: str) -> _Stored | None:
        stored = self.stored.get(rid)
        if stored is not None:
            self.stored.move_to_end(rid)  # 刚用到：最后一个忘
        return stored

    def pop(self, rid: str) -> _Stored | None:
        return self.stored.pop(rid, None)


_store = ResponseStore(MAX_STORED_RESPONSES)


def _previous_items(req: ResponsesRequest) -> List[Dict[str, Any]]:
    """previous_response_id 那段对话的项；没给时是空的。找不到（从没有过、store 是 false、被忘了、删了）是 400。"""
    if req.previous_response_id is None:
        return []
    stored = _store.get(req.previous_response_id)
    if stored is None:
        raise APIError(400, f"Previous response with id '{req.previous_response_id}' not found. This server keeps "
                            f"the last {_store.capacity} responses made without store: false, in memory",
                       param="previous_response_id", code="previous_response_not_found")
    return stored.items


def _remember(req: ResponsesRequest, items: List[Dict[str, Any]], response: Dict[str, Any]) -> Dict[str, Any]:
    """回答完了：store 不是 false 就记下这个响应和它的整段对话。原样返回 response。"""
    if req.store is not False:
        _store.put(response["id"], _Stored(response, items))
    return response


@app.get("/v1/responses/{response_id}")
async def v1_response(response_id: str):
    stored = _store.get(response_id)
    if stored is None:
        raise APIError(404, f"Response with id '{response_id}' not found.")
    return stored.response


@app.delete("/v1/responses/{response_id}")
async def v1_delete_response(response_id: str):
    if _store.pop(response_id) is None:
        raise APIError(404, f"Response with id '{response_id}' not found.")
    return {"id": response_id, "object": "response", "deleted": True}
