# Tangled from book/chapters/ch15_server.ipynb and ch16_scale.ipynb — edit the notebooks, not this file.
from __future__ import annotations

import asyncio
import hmac
import json
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, AsyncIterator, Dict, List, Tuple

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException

from minisgl import __version__
from minisgl.core import SamplingParams
from minisgl.message import AbortMsg, BaseFrontendMsg, BaseTokenizerMsg, BatchFrontendMsg, TokenizeMsg, UserReply
from minisgl.utils import init_logger
from minisgl.utils.mp import ZmqAsyncPullQueue, ZmqAsyncPushQueue

from .args import ServerArgs

logger = init_logger(__name__)


def _unwrap(msg: BaseFrontendMsg) -> List[BaseFrontendMsg]:
    return msg.data if isinstance(msg, BatchFrontendMsg) else [msg]

def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()

@dataclass
class FrontendManager:
    config: ServerArgs
    send_tokenizer: ZmqAsyncPushQueue[BaseTokenizerMsg]
    recv_tokenizer: ZmqAsyncPullQueue[BaseFrontendMsg]
    uid_counter: int = 0
    initialized: bool = False
    ack_map: Dict[int, List[UserReply]] = field(default_factory=dict)
    event_map: Dict[int, asyncio.Event] = field(default_factory=dict)
    start_time: Dict[int, float] = field(default_factory=dict)
    metrics: Metrics = field(default_factory=lambda: Metrics())  # Metrics 在文件后面（/metrics 一节）定义
    dead: str | None = None  # 有工作进程退出了：之后的请求一律 503

    def new_user(self) -> int:
        uid = self.uid_counter
        self.uid_counter += 1
        self.ack_map[uid] = []
        self.event_map[uid] = asyncio.Event()
        self.start_time[uid] = time.perf_counter()
        return uid

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

    async def send_one(self, msg: BaseTokenizerMsg) -> None:
        if self.dead is not None:
            raise APIError(503, f"the server is shutting down: {self.dead}", type="server_error")
        self.start()
        await self.send_tokenizer.put(msg)

    async def first_reply(self, uid: int) -> None:
        """等到第一条回复（不取走）：请求被拒绝或后端挂了时，HTTP 状态码还没发出去，来得及回一个错误。"""
        await self.event_map[uid].wait()
        first = self.ack_map[uid][0]
        if not (first.finished and first.finish_reason in ("abort", "error") and first.completion_tokens == 0):
            return
        self._forget(uid)
        if first.finish_reason == "error":
            raise APIError(503, f"the server is shutting down: {self.dead}", type="server_error")
        if first.prompt_tokens > 0:
            raise APIError(400, f"the prompt has {first.prompt_tokens} tokens: it does not fit in this server's "
                                f"context (--max-seq-len-override)", param="messages", code="context_length_exceeded")
        raise APIError(400, "the prompt is empty after tokenization or cannot be tokenized", param="messages")

    async def wait_for_replies(self, uid: int) -> AsyncIterator[List[UserReply]]:
        """每次醒来，一次取走这个请求已经到了的所有回复（一个列表）；以 finished 的那条结束。"""
        event = self.event_map[uid]
        try:
            while True:
                await event.wait()
                event.clear()
                pending, self.ack_map[uid] = self.ack_map[uid], []
                done = next((i for i, ack in enumerate(pending) if ack.finished), None)
                if done is None:
                    yield pending
                    continue
                last = pending[done]
                if last.finish_reason != "error":
                    self.metrics.observe(last, time.perf_counter() - self.start_time[uid])
                yield pending[:done + 1]
                return
        finally:
            self._forget(uid)

    async def wait_for_ack(self, uid: int) -> AsyncIterator[UserReply]:
        """同上，一条一条地给：不在乎写几次的地方（非流式收集、终端）用它。"""
        async for replies in self.wait_for_replies(uid):
            for ack in replies:
                yield ack

    def _forget(self, uid: int) -> None:
        self.ack_map.pop(uid, None)
        self.event_map.pop(uid, None)
        self.start_time.pop(uid, None)

    def fail_all(self, reason: str) -> None:
        """工作进程退出了：每个还在等回复的请求收到一条 "error" 结束，不会永远挂着。"""
        self.dead = reason
        for uid, event in self.event_map.items():
            self.ack_map[uid].append(UserReply(uid=uid, incremental_output="", finished=True, finish_reason="error"))
            event.set()

    async def stream_generate(self, uid: int) -> AsyncIterator[bytes]:
        async for replies in self.wait_for_replies(uid):
            yield b"".join(_sse(ack.incremental_output) for ack in replies)
        yield b"data: [DONE]\n\n"

    async def stream_chat_completions(self, uid: int, model: str, include_usage: bool,
                                      chat: bool = True) -> AsyncIterator[bytes]:
        """chat=True：/v1/chat/completions 的片段（delta.content）；False：/v1/completions 的片段（text）。"""
        kind = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uid}", "object": kind, "created": int(time.time()),
                "model": model}
        first, last = True, None
        async for replies in self.wait_for_replies(uid):
            frames = []  # 这次醒来拿到的每条回复一个 SSE 事件，合成一次写出
            for ack in replies:
                last = ack
                if ack.finish_reason == "error":
                    frames.append(_sse({"error": {"message": f"the server is shutting down: {self.dead}",
                                                  "type": "server_error", "param": None, "code": None}}))
                    yield b"".join(frames)
                    return
                if chat:
                    delta: Dict[str, str] = {}
                    if first:
                        delta["role"] = "assistant"
                        first = False
                    if ack.incremental_output:
                        delta["content"] = ack.incremental_output
                    choice: Dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
                else:
                    choice = {"index": 0, "text": ack.incremental_output, "finish_reason": None}
                frames.append(_sse({**head, "choices": [choice]}))
            yield b"".join(frames)
        assert last is not None and last.finished
        end: Dict[str, Any] = {"index": 0, "delta": {}} if chat else {"index": 0, "text": ""}
        frames = [_sse({**head, "choices": [{**end, "finish_reason": last.finish_reason}]})]
        if include_usage:  # OpenAI 的约定：最后多一个 choices 为空、只带 usage 的片段
            frames.append(_sse({**head, "choices": [], "usage": _usage(last)}))
        yield b"".join(frames) + b"data: [DONE]\n\n"

    async def stream_with_cancellation(self, gen: AsyncIterator[bytes], request: Request,
                                       uid: int) -> AsyncIterator[bytes]:
        """客户端断开连接时，通知后端中止这个请求，释放它占用的 KV 缓存。"""
        try:
            async for chunk in gen:
                if await request.is_disconnected():
                    raise asyncio.CancelledError
                yield chunk
        except asyncio.CancelledError:
            asyncio.create_task(self.abort_user(uid))
            raise

    async def collect_with_cancellation(self, uid: int, request: Request) -> Tuple[str, UserReply]:
        """非流式：收集全部回复（文字，最后一条回复）；其间每 0.1 秒看一次客户端还在不在，断开了就中止。"""
        async def collect() -> Tuple[str, UserReply]:
            content, last = "", None
            async for ack in self.wait_for_ack(uid):
                content += ack.incremental_output
                last = ack
            assert last is not None and last.finished
            return content, last

        task = asyncio.create_task(collect())
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.1)
                if done:
                    return task.result()
                if await request.is_disconnected():
                    raise asyncio.CancelledError
        except asyncio.CancelledError:
            task.cancel()
            asyncio.create_task(self.abort_user(uid))
            raise

    async def abort_user(self, uid: int) -> None:
        await asyncio.sleep(0.1)
        self._forget(uid)
        logger.warning(f"Aborting request {uid}")
        if self.dead is None:
            await self.send_one(AbortMsg(uid=uid))

    def shutdown(self) -> None:
        self.send_tokenizer.stop()
        self.recv_tokenizer.stop()

def _usage(reply: UserReply) -> Dict[str, int]:
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens}

_STATE: FrontendManager | None = None

def create_frontend(config: ServerArgs) -> FrontendManager:
    """在主进程里建好 API Server 的两个队列（绑定前端地址），之后再启动工作进程。"""
    global _STATE
    _STATE = FrontendManager(
        config=config,
        send_tokenizer=ZmqAsyncPushQueue(config.zmq_tokenizer_addr, create=config.tokenizer_create_addr),
        recv_tokenizer=ZmqAsyncPullQueue(config.zmq_frontend_addr, create=True))
    return _STATE

def get_state() -> FrontendManager:
    assert _STATE is not None, "create_frontend() first"
    return _STATE


class ChatMessage(BaseModel):
    role: str
    content: str | List[Dict[str, Any]]  # 一段文字，或 OpenAI 的 [{"type": "text", "text": ...}, ...]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        if any(part.get("type") != "text" or not isinstance(part.get("text"), str) for part in self.content):
            raise APIError(400, "only text content parts are supported", param="messages")
        return "".join(part["text"] for part in self.content)

class StreamOptions(BaseModel):
    include_usage: bool = False

class OpenAICompletionRequest(BaseModel):
    """/v1/chat/completions 和 /v1/completions 共用的请求体；不认识的字段忽略（OpenAI 客户端会带上很多）。"""

    model_config = ConfigDict(extra="ignore")

    model: str = "default"
    messages: List[ChatMessage] | None = None
    prompt: str | List[str] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None  # 新版 OpenAI 接口对 max_tokens 的叫法
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # 扩展字段
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | List[str] | None = None
    seed: int | None = None
    ignore_eos: bool = False  # 扩展字段：压测时常用
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    chat_template_kwargs: Dict[str, Any] | None = None  # 例如 {"enable_thinking": false}

def _sampling_params(req: OpenAICompletionRequest, default_max_tokens: int | None) -> SamplingParams:
    if req.n != 1:
        raise APIError(400, f"n={req.n} is not supported: this server returns one choice per request", param="n")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name) != 0:
            raise APIError(400, f"{name} is not supported (got {getattr(req, name)})", param=name)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    kwargs: Dict[str, Any] = dict(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p,
                                  ignore_eos=req.ignore_eos, seed=req.seed)
    if max_tokens is not None or default_max_tokens is not None:
        kwargs["max_tokens"] = max_tokens if max_tokens is not None else default_max_tokens
    try:
        return SamplingParams(**kwargs)
    except ValueError as e:  # SamplingParams 的错误以字段名开头："top_p=0 must be in (0, 1]"
        raise APIError(400, str(e), param=str(e).split("=")[0]) from None

def _stop(req: OpenAICompletionRequest) -> List[str]:
    return [req.stop] if isinstance(req.stop, str) else list(req.stop or [])

def _prompt(req: OpenAICompletionRequest) -> str:
    prompt = req.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise APIError(400, f"give one prompt per request, got {len(prompt)}", param="prompt")
        prompt = prompt[0]
    if not prompt:
        raise APIError(400, "the prompt is empty", param="prompt")
    return prompt


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

@app.exception_handler(RequestValidationError)
async def _validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
    """坏的 JSON、类型不对的字段：FastAPI 默认回 422 和它自己的格式；改成 OpenAI 的 400。"""
    err = e.errors()[0]
    if err.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {err.get('ctx', {}).get('error', '')}").response()
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    where = ".".join(loc) or "body"
    return APIError(400, f"{where}: {err.get('msg')}", param=loc[0] if loc else None).response()

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
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, f"Bearer {key}".encode()):
                response = APIError(401, "invalid or missing API key (send the header Authorization: Bearer <key>)",
                                    type="authentication_error", code="invalid_api_key").response()
                return await response(scope, receive, send)
        await self.app(scope, receive, send)

app.add_middleware(_CheckApiKey)


@app.post("/v1/chat/completions")
async def v1_chat_completions(req: OpenAICompletionRequest, request: Request):
    if req.messages:
        text: str | List[Dict[str, str]] = [{"role": m.role, "content": m.text()} for m in req.messages]
    elif req.prompt is not None:
        text = _prompt(req)
    else:
        raise APIError(400, "give a non-empty 'messages' list (or a 'prompt')", param="messages")
    return await _complete(req, request, text, _sampling_params(req, None), chat=True)

@app.post("/v1/completions")
async def v1_completions(req: OpenAICompletionRequest, request: Request):
    """补全接口：原样的提示词，不套对话模板；max_tokens 默认 16（OpenAI 的默认值）。"""
    return await _complete(req, request, _prompt(req), _sampling_params(req, 16), chat=False)

async def _complete(req: OpenAICompletionRequest, request: Request, text: str | List[Dict[str, str]],
                    sp: SamplingParams, chat: bool):
    state = get_state()
    uid = state.new_user()
    await state.send_one(TokenizeMsg(uid=uid, text=text, sampling_params=sp,
                                     chat_options=req.chat_template_kwargs or {}, stop=_stop(req)))
    await state.first_reply(uid)
    if req.stream:
        include_usage = req.stream_options is not None and req.stream_options.include_usage
        gen = state.stream_chat_completions(uid, req.model, include_usage, chat=chat)
        return StreamingResponse(state.stream_with_cancellation(gen, request, uid),
                                 media_type="text/event-stream")
    content, last = await state.collect_with_cancellation(uid, request)
    if last.finish_reason == "error":
        raise APIError(503, f"the server is shutting down: {state.dead}", type="server_error")
    choice: Dict[str, Any] = {"index": 0, "finish_reason": last.finish_reason}
    if chat:
        choice["message"] = {"role": "assistant", "content": content}
    else:
        choice["text"] = content
    return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uid}", "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": req.model, "choices": [choice], "usage": _usage(last)}


class GenerateRequest(BaseModel):
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
    uid = state.new_user()
    await state.send_one(TokenizeMsg(uid=uid, text=req.prompt, sampling_params=sp))
    await state.first_reply(uid)
    return StreamingResponse(state.stream_with_cancellation(state.stream_generate(uid), request, uid),
                             media_type="text/event-stream")

@app.get("/v1/models")
async def v1_models():
    config = get_state().config
    return {"object": "list", "data": [{"id": config.served_model_name, "object": "model", "created": 0,
                                         "owned_by": "minisgl", "root": str(config.model_path)}]}

@app.get("/health")
async def health():
    state = get_state()
    if state.dead is not None:
        return APIError(503, f"the server is shutting down: {state.dead}", type="server_error").response()
    return {"status": "ok"}

@app.get("/metrics")
async def metrics():
    state = get_state()
    state.start()  # 还没有请求时也要开始收调度器的统计
    return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")


@dataclass
class SchedulerStats(BaseFrontendMsg):
    """调度器 rank 0 → API Server（第 15 章加的消息）：/metrics 里只有调度器知道的数。"""

    running: int  # 占着请求槽的请求（prefill 中或 decode 中）
    waiting: int  # 还在排队
    pages_used: int  # 运行中的请求占着的 KV 页
    pages_cached: int  # 前缀缓存里、眼下没有请求在用的页（需要时可以淘汰）
    pages_free: int
    cached_tokens: int  # 附录：前缀缓存累计命中的提示词 token（这些位置不用重新 prefill）

LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)  # 秒

@dataclass
class Metrics:
    """/metrics 的数：调度器最近一次推来的 SchedulerStats，加上 API Server 自己数的 token 和延迟。"""

    stats: SchedulerStats = field(default_factory=lambda: SchedulerStats(0, 0, 0, 0, 0, 0))
    finished: Dict[str, int] = field(default_factory=dict)  # finish_reason → 请求数
    prompt_tokens: int = 0
    generation_tokens: int = 0
    latency_buckets: List[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))  # 累计：<= 上界的个数
    latency_sum: float = 0.0

    @property
    def ready(self) -> bool:
        """收到过调度器的统计了吗：KV 池至少有一页，真实的统计里三类页之和总是正的。"""
        s = self.stats
        return s.pages_used + s.pages_cached + s.pages_free > 0

    def observe(self, reply: UserReply, seconds: float) -> None:
        reason = reply.finish_reason or "stop"
        self.finished[reason] = self.finished.get(reason, 0) + 1
        self.prompt_tokens += reply.prompt_tokens
        self.generation_tokens += reply.completion_tokens
        self.latency_sum += seconds
        for i, bound in enumerate(LATENCY_BUCKETS):
            self.latency_buckets[i] += seconds <= bound

    def render(self) -> str:
        """Prometheus 的文本格式：# HELP、# TYPE，然后每行一个 名字{标签} 值。"""
        s, out = self.stats, []

        def metric(name: str, kind: str, doc: str, samples: List[str]) -> None:
            out.extend([f"# HELP minisgl_{name} {doc}", f"# TYPE minisgl_{name} {kind}", *samples])

        for name, value, doc in [("num_running_requests", s.running, "Requests holding a slot"),
                                 ("num_waiting_requests", s.waiting, "Requests waiting for a slot"),
                                 ("kv_pages_used", s.pages_used, "KV pages owned by running requests"),
                                 ("kv_pages_cached", s.pages_cached, "KV pages held by the prefix cache only"),
                                 ("kv_pages_free", s.pages_free, "KV pages on the free list")]:
            metric(name, "gauge", doc, [f"minisgl_{name} {value}"])
        metric("prompt_tokens_total", "counter", "Prompt tokens of finished requests",
               [f"minisgl_prompt_tokens_total {self.prompt_tokens}"])
        metric("cached_tokens_total", "counter", "Prompt tokens found in the prefix cache (not prefilled again)",
               [f"minisgl_cached_tokens_total {s.cached_tokens}"])
        metric("generation_tokens_total", "counter", "Generated tokens of finished requests",
               [f"minisgl_generation_tokens_total {self.generation_tokens}"])
        metric("requests_finished_total", "counter", "Finished requests by finish reason",
               [f'minisgl_requests_finished_total{{reason="{r}"}} {n}' for r, n in sorted(self.finished.items())])
        count = sum(self.finished.values())
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
    state.start()
    for _ in range(40):  # 服务刚起来、调度器的第一条统计还没到：最多等 2 秒，不拿全 0 充数
        if state.metrics.ready:
            break
        await asyncio.sleep(0.05)
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
                                "kv_pages_free": s.pages_free, "cached_tokens": s.cached_tokens,
                                "prompt_tokens": m.prompt_tokens, "generation_tokens": m.generation_tokens}]
    info["version"] = __version__
    return info
