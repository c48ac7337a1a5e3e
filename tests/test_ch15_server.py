# Tangled from book/chapters/ch15_server.ipynb — edit the notebook, not this file.
"""第 15 章：一个真实的 python -m minisgl 进程，用官方 openai 客户端访问：贪心结果与 transformers 相同、流式与并发、
断开即中止、坏请求的 4xx、/metrics、API key、stop 与 seed、信号与工作进程的退出、终端里的 shell。"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import httpx
import psutil
import pytest
from openai import AsyncOpenAI, OpenAI

# float32 + torch 注意力：CPU 上就是默认值；在 GPU 机器上跑这些测试时，贪心结果才能和 transformers 逐 token 比较
SERVER_FLAGS = ["--num-pages", "2048", "--max-seq-len-override", "256", "--dtype", "float32", "--attn", "torch"]
RUNNING: Dict[int, subprocess.Popen] = {}  # 端口 → 服务进程：最后几个测试给服务发信号、杀它的工作进程
LOGS: Dict[int, Path] = {}  # 端口 → 服务的日志（stdout 和 stderr）

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def spawn_server(model: Path, log: Path, *flags: str) -> Tuple[subprocess.Popen, int]:
    """python -m minisgl 作为子进程（自己一个进程组），输出写进 log；不等它就绪。"""
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "minisgl", "--model", str(model), "--port", str(port),
                                 *SERVER_FLAGS, *flags], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, port

def start_server(model: Path, log: Path, *flags: str) -> Tuple[subprocess.Popen, int]:
    """spawn_server，再等到 /health 回 200。"""
    proc, port = spawn_server(model, log, *flags)
    deadline = time.time() + 240
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                RUNNING[port], LOGS[port] = proc, log
                return proc, port
        except httpx.HTTPError:
            pass
        assert time.time() < deadline, f"the server did not start:\n{log.read_text()[-3000:]}"
        time.sleep(0.3)

def stop_server(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()

@pytest.fixture(scope="module")
def server(tiny_qwen3: Path, tmp_path_factory) -> Iterator[Tuple[int, Path]]:
    """随机的小 Qwen3（真实的 Qwen3 分词器），默认参数：一个 detokenizer 兼做分词。"""
    log = tmp_path_factory.mktemp("server") / "server.log"
    proc, port = start_server(tiny_qwen3, log)
    yield port, log
    stop_server(proc)

@pytest.fixture(scope="module")
def smol_server(smollm2: Path, tmp_path_factory) -> Iterator[Tuple[int, str]]:
    """内置的 SmolLM2，带 API key，两个单独的 tokenizer 进程（stop 字符串和 usage 要经 detokenizer 转达，
    每个请求的中止要回到给它分词的那个 tokenizer）。"""
    log = tmp_path_factory.mktemp("smol") / "server.log"
    proc, port = start_server(smollm2, log, "--api-key", "sk-test", "--num-tokenizer", "2")
    yield port, "sk-test"
    stop_server(proc)

def client(port: int, key: str = "none") -> OpenAI:
    return OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=60)

def metrics(port: int) -> Dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if not line.startswith("#")}


PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "北京烤鸭很好吃。"]

def test_greedy_equals_transformers(server, tiny_qwen3: Path) -> None:
    """非流式输出与 transformers 在同一份权重上的贪心结果逐字相同：补全（原样的提示词）和对话（套模板）。"""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    port, _ = server
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32).eval()

    def hf(ids: List[int], n: int) -> Tuple[str, int]:
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)[0, len(ids):].tolist()
        return tok.decode(out, skip_special_tokens=True), len(ids)

    c = client(port)
    for prompt in PROMPTS:
        r = c.completions.create(model="m", prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
        text, n_prompt = hf(tok.encode(prompt), 12)
        assert r.choices[0].text == text and r.choices[0].finish_reason == "length"
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (n_prompt, 12)
    chat = [{"role": "user", "content": "你好"}]
    r = c.chat.completions.create(model="m", messages=chat, max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert r.choices[0].message.content == hf(list(ids), 10)[0]


def test_client_disconnect_aborts_request(server):
    """客户端中途断开：服务端中止请求并释放资源，之后的请求照常工作。"""
    port, log_path = server
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions",
                      json={"model": "m", "prompt": "Tell me a long story.", "max_tokens": 200,
                            "stream": True, "ignore_eos": True}, timeout=60) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 3:
                break  # 读了几段就断开
    time.sleep(1.0)
    resp = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                      json={"model": "m", "prompt": "1 + 1 =", "max_tokens": 4}, timeout=60)
    assert resp.status_code == 200
    assert "Aborting request" in log_path.read_text()


def test_non_streamed_disconnect_aborts_request(server):
    """非流式请求的客户端超时断开：服务端在一秒之内中止它（日志里多一条 Aborting），请求槽和页都回来，之后照常。"""
    port, log_path = server
    before = log_path.read_text().count("Aborting request")
    with pytest.raises(httpx.ReadTimeout):  # 240 个 token 要生成好一会儿，客户端 0.3 秒就不等了
        httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=0.3,
                   json={"model": "m", "prompt": "Tell me a long story.", "max_tokens": 240, "ignore_eos": True})
    t0 = time.monotonic()
    while (m := metrics(port))["minisgl_num_running_requests"] or m["minisgl_kv_pages_used"]:
        assert time.monotonic() - t0 < 1.0, f"the request still holds its slot and pages 1 s after its client left: {m}"
        time.sleep(0.05)
    assert log_path.read_text().count("Aborting request") == before + 1
    resp = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                      json={"model": "m", "prompt": "1 + 1 =", "max_tokens": 4}, timeout=60)
    assert resp.status_code == 200


def test_stream_and_concurrent(server) -> None:
    """补全和对话、流式和非流式给出同样的文字和 usage；32 个并发的流与各自单独发的结果相同。"""
    port, _ = server
    c = client(port)
    kw: Dict[str, Any] = dict(model="m", max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    whole = c.completions.create(prompt="Once upon a time", **kw)
    chunks = list(c.completions.create(prompt="Once upon a time", stream=True,
                                       stream_options={"include_usage": True}, **kw))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == whole.choices[0].text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 16
    chat = [{"role": "user", "content": "Tell me a story."}]
    whole = c.chat.completions.create(messages=chat, **kw)
    parts = list(c.chat.completions.create(messages=chat, stream=True, **kw))
    assert parts[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parts) == whole.choices[0].message.content
    assert whole.usage.completion_tokens == 16

    kw["max_tokens"] = 8
    prompts = [f"Request {i}: " + "word " * (i % 7) for i in range(32)]
    sequential = [c.completions.create(prompt=p, **kw).choices[0].text for p in prompts]

    async def one(ac: AsyncOpenAI, p: str) -> str:
        stream = await ac.completions.create(prompt=p, stream=True, **kw)
        return "".join([ch.choices[0].text async for ch in stream if ch.choices])

    async def all_at_once() -> List[str]:
        ac = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
        return list(await asyncio.gather(*(one(ac, p) for p in prompts)))

    assert asyncio.run(all_at_once()) == sequential


def test_disconnect_storm_frees_everything(server) -> None:
    """16 个流同时断开：/metrics 回到 0 个运行中、0 个排队、请求占着的 KV 页为 0（前缀缓存里的不算）；之后照常回答。"""
    port, _ = server

    async def hang_up(i: int) -> None:
        async with httpx.AsyncClient(timeout=60) as h:
            body = {"model": "m", "prompt": f"story {i} " * 20, "max_tokens": 150, "stream": True, "ignore_eos": True}
            async with h.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
                assert r.status_code == 200
                async for _ in r.aiter_lines():
                    break

    async def storm() -> None:
        await asyncio.gather(*(hang_up(i) for i in range(16)))

    aborted = metrics(port).get('minisgl_requests_finished_total{reason="abort"}', 0)
    asyncio.run(storm())
    deadline = time.time() + 30
    while True:
        m = metrics(port)
        if (m["minisgl_num_running_requests"], m["minisgl_num_waiting_requests"], m["minisgl_kv_pages_used"]) == (0, 0, 0):
            break
        assert time.time() < deadline, f"resources were not released: {m}"
        time.sleep(0.3)
    assert m["minisgl_kv_pages_free"] + m["minisgl_kv_pages_cached"] > 0
    assert m['minisgl_requests_finished_total{reason="abort"}'] == aborted + 16  # 每个断开的流恰好数一次
    done = m['minisgl_request_latency_seconds_bucket{le="+Inf"}']  # 延迟只算跑完的请求
    r = client(port).completions.create(model="m", prompt="after the storm", max_tokens=2,
                                        extra_body={"ignore_eos": True})  # 服务照常回答
    m = metrics(port)
    assert r.usage.completion_tokens == 2 and m['minisgl_request_latency_seconds_bucket{le="+Inf"}'] == done + 1
    assert m["minisgl_generation_tokens_total"] >= 2

def test_a_client_that_leaves_while_queued_is_aborted_at_once(tiny_qwen3: Path, tmp_path: Path) -> None:
    """--max-running-requests 1：一个长请求占着唯一的槽，后面 4 个（流式和非流式）排着队时客户端就走了。它们在
    排队时就被中止——长请求还在跑，队列已经空了——而不是等到被接纳、算完 prefill；日志里没有 traceback。"""
    proc, port = start_server(tiny_qwen3, tmp_path / "server.log", "--max-running-requests", "1",
                              "--max-seq-len-override", "4096", "--num-pages", "8192")
    try:
        client(port).completions.create(model="m", prompt="warm up", max_tokens=2)
        aborted = 'minisgl_requests_finished_total{reason="abort"}'
        before = metrics(port).get(aborted, 0)

        async def leave(i: int) -> None:  # 请求发出去，0.5 秒后客户端走了（它还在排队）
            body = {"model": "m", "prompt": f"queued {i}", "max_tokens": 8, "stream": i % 2 == 0}
            async with httpx.AsyncClient() as h:
                with contextlib.suppress(httpx.TimeoutException):
                    await h.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=0.5)

        async def scenario() -> Dict[str, float]:
            async with httpx.AsyncClient(timeout=60) as h:  # 占着槽的长请求：几千个 token，要跑好几秒
                body = {"model": "m", "prompt": "long", "stream": True, "ignore_eos": True, "max_tokens": 4000}
                async with h.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
                    lines = r.aiter_lines()  # 留着它：生成器被回收时 httpx 会关掉这个流
                    await lines.__anext__()  # 它已经在跑了
                    await asyncio.gather(*(leave(i) for i in range(4)))
                    deadline = time.time() + 5
                    while (m := metrics(port))["minisgl_num_waiting_requests"] or m.get(aborted, 0) < before + 4:
                        assert time.time() < deadline, f"the queued requests were not aborted: {m}"
                        await asyncio.sleep(0.1)
                    await lines.aclose()
                    return m  # 然后这个客户端也走了：长请求被中止

        m = asyncio.run(scenario())
        assert m["minisgl_num_running_requests"] == 1 and m[aborted] == before + 4  # 长请求还在跑
        deadline = time.time() + 30
        while (m := metrics(port))["minisgl_num_running_requests"] or m["minisgl_kv_pages_used"]:
            assert time.time() < deadline, m
            time.sleep(0.3)
        assert m[aborted] == before + 5
        assert "Traceback" not in (tmp_path / "server.log").read_text()
    finally:
        stop_server(proc)


BAD: List[Tuple[str, Any, str | None]] = [  # (接口, 请求体, OpenAI 错误里的 param)
    ("/v1/chat/completions", b"{not json", None),
    ("/v1/chat/completions", {"model": "m"}, "messages"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}, "prompt"),  # 哪个算？
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 0}, "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, "top_p"),
    ("/v1/completions", {"prompt": "hi", "top_k": 0}, "top_k"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1.5}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0},
     "max_completion_tokens"),  # 错误里是客户端用的字段名
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 10**6},
     "max_completion_tokens"),  # 分词进程发现放不下：同样换成客户端的字段名
    ("/v1/completions", {"prompt": "hi", "seed": -2**63 - 1}, "seed"),  # OpenAI 的 seed 是 int64
    ("/v1/completions", {"prompt": ""}, "prompt"),
    ("/v1/completions", {"prompt": ["a", ""]}, "prompt"),
    ("/v1/completions", {"prompt": [["a"]]}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "stream": True, "n": 129}, "n"),
    ("/v1/completions", {"prompt": "word " * 300}, "prompt"),  # 比上下文（256）长
    ("/v1/completions", {"prompt": "word " * 300, "stream": True}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 300}]}, "messages"),
    ("/v1/completions", {"prompt": "hi", "stop": ["x"] * 17}, "stop"),  # 每个 token 都要找一遍的 stop 字符串：有上限
    ("/v1/responses", {"input": [{"role": "user", "content": ["hi"]}]}, "input"),  # 内容片段不是对象
    ("/generate", {"prompt": ""}, "prompt"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}',
     "temperature"),  # Python 的 json 收 Infinity；不是有限数的温度没有意义
]

def test_malformed_requests(server) -> None:
    """每个坏请求都是 4xx 和 OpenAI 格式的错误，绝不是 5xx 或挂起；之后服务照常。"""
    port, _ = server
    for path, body, param in BAD:
        kw = {"content": body} if isinstance(body, bytes) else {"json": body}
        r = httpx.post(f"http://127.0.0.1:{port}{path}", timeout=30, headers={"Content-Type": "application/json"}, **kw)
        assert r.status_code == 400, (path, body, r.status_code, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], err
        assert err["param"] == param, (body, err)
    r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", content=b'{"prompt": "hi"}',
                   headers={"Content-Type": "application/x-www-form-urlencoded"})  # curl -d 不加 -H 时就是这个类型
    assert r.status_code == 400 and "Content-Type: application/json" in r.json()["error"]["message"], r.text
    r = httpx.get(f"http://127.0.0.1:{port}/nope")
    assert r.status_code == 404 and "error" in r.json()
    with pytest.raises(Exception) as e:  # 官方客户端把 400 变成 BadRequestError
        client(port).completions.create(model="m", prompt="hi", top_p=2.0)
    assert getattr(e.value, "status_code", None) == 400
    assert client(port).completions.create(model="m", prompt="hi", max_tokens=2).usage.completion_tokens <= 2

SURROGATES = [  # (接口, 原样的请求体：JSON 里写着落单的代理, 错误里说的位置)
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "bad \\ud800 text"}]}', "messages.0.content"),
    ("/v1/completions", b'{"prompt": ["a long story", "bad \\udfff"], "max_tokens": 200, "ignore_eos": true}',
     "prompt.1"),  # 第一个提示词没问题：它也不能先发出去、没人收地跑下去
    ("/v1/completions", b'{"prompt": "hi", "stop": ["ok", "\\ud800"]}', "stop.1"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"\\udc00": 1}}',
     "logit_bias.\\udc00"),  # 键里的代理：错误消息里写成转义
    ("/v1/responses", b'{"input": "x \\ud800"}', "input"),
    ("/generate", b'{"prompt": "x \\ud800"}', "prompt"),
]

def test_lone_surrogates_are_400_and_start_nothing(server) -> None:
    """JSON 里落单的 UTF-16 代理（"\\ud800"）：400，错误说出在哪个字段；什么也没发给后端——没有请求在跑、
    结束的请求数和生成的 token 数都不变。"""
    port, _ = server
    before = metrics(port)
    for path, body, where in SURROGATES:
        r = httpx.post(f"http://127.0.0.1:{port}{path}", content=body, headers={"Content-Type": "application/json"},
                       timeout=30)
        assert r.status_code == 400, (path, r.status_code, r.text)
        message = r.json()["error"]["message"]
        assert f"{where} is not valid Unicode text" in message and "surrogate" in message, message
    time.sleep(1.0)  # 真发出去了的话，这时它正在生成（或已经结束、被数进了 /metrics）
    after = metrics(port)
    assert after["minisgl_num_running_requests"] == 0 and after["minisgl_kv_pages_used"] == 0, after
    for key in ("minisgl_generation_tokens_total", 'minisgl_request_latency_seconds_bucket{le="+Inf"}'):
        assert after[key] == before[key], key


def test_deep_json_and_odd_digits_are_400(server) -> None:
    """几百层的 JSON（解析得了，可之后的递归会栈溢出）和 str.isdigit() 认、int() 不认的 logit_bias 键：400，
    指明位置或参数，服务照常回答。"""
    port, _ = server
    deep = json.loads("[" * 600 + "]" * 600)
    chat = [{"role": "user", "content": "hi"}]
    for path, body, where in [("/v1/chat/completions", {"messages": chat, "chat_template_kwargs": {"x": deep}},
                               "chat_template_kwargs.x.0.0"),
                              ("/v1/completions", {"prompt": "hi", "logit_bias": {"1": deep}}, "logit_bias.1.0.0"),
                              ("/v1/responses", {"input": [{"role": "user", "content": [deep]}]}, "input.0.content.0.0")]:
        r = httpx.post(f"http://127.0.0.1:{port}{path}", json=body, timeout=30)
        message = r.json()["error"]["message"]
        assert r.status_code == 400 and where in message and "more than 64 levels deep" in message, r.text
        assert r.json()["error"]["param"] == where.split(".")[0], r.text  # 位置的第一段
    for key in ("²", "1" * 5000, "٣"):  # 上标 2、五千位、阿拉伯-印度数字 3
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=30,
                       json={"prompt": "hi", "max_tokens": 2, "logit_bias": {key: 1}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", r.text
    assert client(port).completions.create(model="m", prompt="hi", max_tokens=2).choices[0].finish_reason == "length"


def hf_model(tiny: Path) -> Tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny), AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()

def hf_steps(model: Any, ids: List[int], n: int, presence: float = 0.0, frequency: float = 0.0,
             repetition: float = 1.0, bias: Dict[int, float] | None = None) -> Tuple[List[int], List[Any]]:
    """参照实现：transformers 的前向，一步一步贪心；每步返回原始 logits 的 log_softmax（logprobs 比的就是它）。
    惩罚项按 OpenAI / vLLM 的定义：presence、frequency 只看生成的 token，repetition 看提示词和生成的全部 token
    （正的 logit 除以它、负的乘以它），logit_bias 直接加。"""
    import torch

    out: List[int] = []
    logprobs = []
    for _ in range(n):
        with torch.no_grad():
            logits = model(torch.tensor([ids + out])).logits[0, -1].double()
        logprobs.append(torch.log_softmax(logits, -1))
        seen = torch.tensor(sorted(set(ids + out)))
        logits[seen] = torch.where(logits[seen] > 0, logits[seen] / repetition, logits[seen] * repetition)
        for t in set(out):
            logits[t] -= presence + frequency * out.count(t)
        for t, b in (bias or {}).items():
            logits[t] += b
        out.append(int(logits.argmax()))
    return out, logprobs

def test_logprobs_equal_transformers(server, tiny_qwen3: Path) -> None:
    """logprobs 是模型原始分布的 log_softmax：和 transformers 在同一份权重上逐步算的相同（1e-4），top_logprobs 是
    最可能的那几个；对话和补全、流式和非流式给出同样的数，对话里各项的 bytes 接起来就是文字。"""
    port, _ = server
    tok, model = hf_model(tiny_qwen3)
    c = client(port)
    prompt = "The capital of France is"
    ids = tok.encode(prompt)
    want, hf_lp = hf_steps(model, ids, 6)
    kw: Dict[str, Any] = dict(model="m", max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    r = c.completions.create(prompt=prompt, logprobs=3, **kw)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == tok.decode(want, skip_special_tokens=True) and len(lp.tokens) == 6
    for step, (t, got, top) in enumerate(zip(want, lp.token_logprobs, lp.top_logprobs)):
        assert abs(got - float(hf_lp[step][t])) < 1e-4, (step, got, float(hf_lp[step][t]))
        best = hf_lp[step].topk(3)
        assert len(top) == 3 and sorted(top.values(), reverse=True) == pytest.approx(best.values.tolist(), abs=1e-4)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    text = r.choices[0].text  # 每个完整的 token 的文字都从它的 text_offset 开始（半个字符的 token 显示成 '\\x..'）
    assert all(text.startswith(t, o) for t, o in zip(lp.tokens, lp.text_offset) if "\\x" not in t), lp
    chunks = [ch for ch in c.completions.create(prompt=prompt, logprobs=3, stream=True, **kw) if ch.choices]
    assert sum((ch.choices[0].logprobs.token_logprobs for ch in chunks if ch.choices[0].logprobs), []) == \
        pytest.approx(lp.token_logprobs, abs=1e-4)
    chat = [{"role": "user", "content": "你好"}]
    chat_ids = list(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False))
    want, hf_lp = hf_steps(model, chat_ids, 6)
    r = c.chat.completions.create(messages=chat, logprobs=True, top_logprobs=2, **kw)
    content = r.choices[0].logprobs.content
    assert [e.logprob for e in content] == pytest.approx([float(hf_lp[i][t]) for i, t in enumerate(want)], abs=1e-4)
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.logprob - 1e-6 for e in content)
    assert bytes(sum((e.bytes for e in content), [])).decode() == r.choices[0].message.content
    parts = list(c.chat.completions.create(messages=chat, logprobs=True, top_logprobs=2, stream=True, **kw))
    streamed = [e.logprob for p in parts if p.choices and p.choices[0].logprobs for e in p.choices[0].logprobs.content]
    assert streamed == pytest.approx([e.logprob for e in content], abs=1e-4)

def test_n_choices(server) -> None:
    """n 个回答：index 0..n-1；给了 seed 时第 j 个回答和单独发、seed + j 的请求一样；流式的片段各带自己的 index、
    每个回答一个 finish 片段、finish 之前没有空片段；usage 里提示词只算一次。"""
    port, _ = server
    c = client(port)
    chat = [{"role": "user", "content": "Write a poem."}]
    kw: Dict[str, Any] = dict(model="m", messages=chat, max_tokens=8, temperature=1.0, extra_body={"ignore_eos": True})
    c.chat.completions.create(**{**kw, "max_tokens": 1})  # 先把提示词算进前缀缓存：之后每个回答都以同样的方式命中它
    r = c.chat.completions.create(n=3, seed=11, **kw)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    single = [c.chat.completions.create(seed=11 + j, **kw) for j in range(3)]
    assert [ch.message.content for ch in r.choices] == [s.choices[0].message.content for s in single]
    assert r.usage.prompt_tokens == single[0].usage.prompt_tokens and r.usage.completion_tokens == 24
    texts: Dict[int, str] = {0: "", 1: "", 2: ""}
    finished: List[int] = []
    for ch in c.chat.completions.create(n=3, seed=11, stream=True, stream_options={"include_usage": True}, **kw):
        if not ch.choices:
            assert ch.usage.completion_tokens == 24 and ch.usage.prompt_tokens == r.usage.prompt_tokens
            continue
        choice = ch.choices[0]
        assert choice.index not in finished, "a chunk after its choice's finish chunk"
        if choice.finish_reason is not None:
            finished.append(choice.index)
        else:
            assert choice.delta.role == "assistant" or choice.delta.content, ch  # 没有空的中间片段
            texts[choice.index] += choice.delta.content or ""
    assert sorted(finished) == [0, 1, 2] and [texts[j] for j in range(3)] == [ch.message.content for ch in r.choices]

def test_n_choices_share_the_prompt_prefill(server) -> None:
    """n 个回答的提示词相同：调度器让后几个等一步，从前缀缓存里拿到整段提示词（只差最后一个 token）。"""
    port, _ = server
    r = client(port).completions.create(model="m", prompt="A fresh prompt nobody sent before: " + "x y " * 20,
                                        n=3, max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
    assert len({ch.text for ch in r.choices}) == 1  # 贪心：三个回答一样
    assert r.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 1, r.usage

def test_sampling_controls_through_http(server, tiny_qwen3: Path) -> None:
    """惩罚项、logit_bias、stop_token_ids 经过 HTTP 真的作用在采样上：贪心结果等于按同样定义改 logits 的参照实现。"""
    port, _ = server
    tok, model = hf_model(tiny_qwen3)
    c = client(port)
    prompt = "1, 2, 3, 4,"
    ids = tok.encode(prompt)

    plain, _ = hf_steps(model, ids, 10)
    assert tok.decode(plain, skip_special_tokens=True) == c.completions.create(model="m", prompt=prompt, max_tokens=10, temperature=0,
                                                     extra_body={"ignore_eos": True}).choices[0].text
    for kw, ref in [(dict(presence_penalty=1.5, frequency_penalty=0.5), dict(presence=1.5, frequency=0.5)),
                    (dict(extra_body={"repetition_penalty": 1.3}), dict(repetition=1.3)),
                    (dict(logit_bias={str(plain[2]): -100, "11": 5}), dict(bias={plain[2]: -100, 11: 5}))]:
        want, _ = hf_steps(model, ids, 10, **ref)  # type: ignore[arg-type]
        r = c.completions.create(model="m", prompt=prompt, max_tokens=10, temperature=0,
                                 extra_body={"ignore_eos": True, **kw.pop("extra_body", {})}, **kw)
        assert r.choices[0].text == tok.decode(want, skip_special_tokens=True), (kw, ref)
        assert want != plain  # 参照实现里它确实改变了结果：测试不是白测
    k = next(i for i in range(2, 10) if plain[i] not in plain[:i])  # 第一次出现在第 k 步的 token
    stop = c.completions.create(model="m", prompt=prompt, max_tokens=10, temperature=0,
                                extra_body={"ignore_eos": True, "stop_token_ids": [plain[k]]})
    assert stop.choices[0].finish_reason == "stop"
    assert stop.choices[0].text == tok.decode(plain[:k], skip_special_tokens=True)
    assert stop.usage.completion_tokens == k + 1  # stop token 算在生成里，但不显示

def test_prompts_as_lists_and_token_ids(server, tiny_qwen3: Path) -> None:
    """/v1/completions 的 prompt：几个字符串 × n（index = 提示词序号 × n + j）、一串 token id、几串 token id；
    token id 的提示词和同样文字的提示词结果相同；usage 里每个提示词算一次。"""
    port, _ = server
    tok, _ = hf_model(tiny_qwen3)
    c = client(port)
    kw: Dict[str, Any] = dict(model="m", max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    prompts = ["Once upon a time", "The capital of France is"]
    alone = [c.completions.create(prompt=p, **kw) for p in prompts]
    r = c.completions.create(prompt=prompts, n=2, **kw)
    assert [ch.index for ch in r.choices] == [0, 1, 2, 3]
    assert [ch.text for ch in r.choices] == [a.choices[0].text for a in alone for _ in range(2)]
    assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone) and r.usage.completion_tokens == 20
    ids = [tok.encode(p) for p in prompts]
    assert c.completions.create(prompt=ids[0], **kw).choices[0].text == alone[0].choices[0].text
    assert [ch.text for ch in c.completions.create(prompt=ids, **kw).choices] == [a.choices[0].text for a in alone]
    echo = c.completions.create(prompt=prompts[0], echo=True, **kw)
    assert echo.choices[0].text == prompts[0] + alone[0].choices[0].text

def test_defaults_models_and_model_name(server) -> None:
    """max_tokens 不给：补全 16 个（OpenAI 的默认值），对话一直到上下文满；响应里的 model 是服务的模型名；
    /v1/models/{id}（不认识的 id 是 404）和 max_model_len。"""
    port, _ = server
    c = client(port)
    r = c.completions.create(model="whatever", prompt="hi", temperature=0, extra_body={"ignore_eos": True})
    name = c.models.list().data[0].id
    assert r.usage.completion_tokens == 16 and r.model == name != "whatever"
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.total_tokens == 256  # --max-seq-len-override 256
    card = c.models.retrieve(name)
    assert card.id == name and card.model_extra["max_model_len"] == 256
    with pytest.raises(Exception) as e:
        c.models.retrieve("no-such-model")
    assert getattr(e.value, "status_code", None) == 404

REFUSED = ["tools", "tool_choice", "functions", "function_call", "audio", "prediction", "parallel_tool_calls",
           "reasoning_effort", "web_search_options", "no_such_field"]

def test_nothing_is_silently_dropped(server) -> None:
    """不支持的字段一律 400，错误说出字段名；OpenAI 说可以忽略的（user、metadata……）照收；值为 null 和没给一样。"""
    port, _ = server
    chat = [{"role": "user", "content": "hi"}]
    url = f"http://127.0.0.1:{port}/v1"
    for name in REFUSED:
        r = httpx.post(f"{url}/chat/completions", json={"messages": chat, name: [{"type": "function"}]}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == name and name in r.json()["error"]["message"]
    special = [({"response_format": {"type": "json_object"}}, "response_format"), ({"modalities": ["audio"]}, "modalities"),
               ({"stream_options": {"include_usage": True}}, "stream_options"), ({"top_logprobs": 2}, "top_logprobs"),
               ({"max_tokens": 10**6}, "max_tokens"), ({"logit_bias": {"99999999": 1}}, "logit_bias"),
               ({"messages": [{"role": "assistant", "content": "x", "tool_calls": []}]}, "messages"),
               ({"max_tokens": "3"}, "max_tokens"), ({"stream": "true"}, "stream"), ({"n": True}, "n"),
               ({"logprobs": 1}, "logprobs"), ({"seed": 2**63}, "seed")]  # 类型不对不替客户端转换；seed 是 int64
    for extra, param in special:
        r = httpx.post(f"{url}/chat/completions", json={"messages": chat, **extra}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (extra, r.text)
    big = httpx.post(f"{url}/completions", json={"prompt": "hi", "max_tokens": 1000}, timeout=30).json()["error"]
    assert re.search(r"max_tokens=1000 is too large: the prompt has \d+ tokens and the context is 256", big["message"])
    for extra, param in [({"suffix": "!"}, "suffix"), ({"echo": True, "logprobs": 1}, "echo"), ({"best_of": 3}, "best_of"),
                         ({"logprobs": 6}, "logprobs"), ({"prompt": [1, 10**9]}, "prompt")]:
        r = httpx.post(f"{url}/completions", json={"prompt": "hi", **extra}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (extra, r.text)
    ok = {"user": "u1", "metadata": {"k": "v"}, "store": False, "service_tier": "auto", "safety_identifier": "s",
          "prompt_cache_key": "k", "tools": None, "functions": None, "response_format": {"type": "text"},
          "max_tokens": 2, "messages": chat + [{"role": "assistant", "content": "x", "tool_calls": None}, chat[0]],
          "no_stop_trim": False, "skip_special_tokens": True, "separate_reasoning": True}  # sglang-router 带的默认值
    assert httpx.post(f"{url}/chat/completions", json=ok, timeout=30).status_code == 200
    body = {"messages": chat, "max_tokens": 3, "stream": True, "seed": -7,  # 负的 seed 也是 OpenAI 的 int64
            "stream_options": {"include_usage": True, "include_obfuscation": False}}
    lines = httpx.post(f"{url}/chat/completions", json=body, timeout=30).text.split("\n\n")
    frames = [json.loads(x[len("data: "):]) for x in lines if x.startswith("data: {")]
    assert lines[-2] == "data: [DONE]" and frames[-1]["choices"] == [] and frames[-1]["usage"]["completion_tokens"] == 3
    assert all("usage" in f and f["usage"] is None for f in frames[:-1])  # 其余片段带着 "usage": null
    r = httpx.post(f"{url}/completions", json={"prompt": "hi", "no_stop_trim": True}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "no_stop_trim"

def test_responses_api(server) -> None:
    """/v1/responses：和同样消息的对话接口给出同样的文字和 token 数；流式事件的顺序和 sequence_number，delta 接起来
    就是文字；到了 max_output_tokens 是 incomplete；工具、previous_response_id、非文字的输出格式回 400。"""
    port, _ = server
    c = client(port)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story."}]
    ref = c.chat.completions.create(model="m", messages=chat, max_tokens=6, temperature=0)
    r = c.responses.create(model="m", instructions="Be brief.", input="Tell me a story.", max_output_tokens=6,
                           temperature=0)
    assert r.output_text == ref.choices[0].message.content and r.model == ref.model
    assert (r.usage.input_tokens, r.usage.output_tokens) == (ref.usage.prompt_tokens, ref.usage.completion_tokens)
    assert r.status == ("incomplete" if ref.choices[0].finish_reason == "length" else "completed")
    parts = [{"role": "system", "content": "Be brief."},
             {"role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]}]
    events = list(c.responses.create(model="m", input=parts, max_output_tokens=6, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{r.status}"] and set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text == \
        events[-1].response.output_text
    url = f"http://127.0.0.1:{port}/v1/responses"
    for extra, param in [({"tools": []}, "tools"), ({"previous_response_id": "resp_1"}, "previous_response_id"),
                         ({"text": {"format": {"type": "json_object"}}}, "text"), ({"truncation": "auto"}, "truncation"),
                         ({"input": [{"type": "function_call_output", "output": "x"}]}, "input")]:
        resp = httpx.post(url, json={"input": "hi", **extra}, timeout=30)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, (extra, resp.text)
    routed = {"input": "Tell me a story.", "instructions": "Be brief.", "max_output_tokens": 6, "temperature": 0.0,
              "model": "unknown", "store": True, "stream": None, "top_p": 1.0, "priority": 0, "top_k": -1, "min_p": 0.0,
              "repetition_penalty": 1.0}  # sglang-router 转发的样子（附录）
    resp = httpx.post(url, json=routed, timeout=30)
    assert resp.status_code == 200 and resp.json()["output"][0]["content"][0]["text"] == r.output_text, resp.text
    for body, param in [({**routed, "priority": 1}, "priority"), ({**routed, "max_output_tokens": 0}, "max_output_tokens")]:
        resp = httpx.post(url, json=body, timeout=30)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text
        assert param in resp.json()["error"]["message"], resp.text


def test_api_key_stop_and_seed(smol_server) -> None:
    """SmolLM2 + 单独的 tokenizer 进程：没有 key 回 401；stop 字符串截断输出；同一个 seed 的采样结果相同。"""
    port, key = smol_server
    r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "hi"}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    for header, status in [(f"bearer {key}", 200), (f"BEARER  {key}", 200), (f"Bearer {key}x", 401), (key, 401)]:
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "hi", "max_tokens": 1},
                       headers={"Authorization": header}, timeout=30)
        assert r.status_code == status, (header, r.text)
    assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200  # 健康检查不要 key
    c = client(port, key)
    assert c.models.list().data[0].id == "SmolLM2-135M-Instruct"
    free = c.completions.create(model="m", prompt="1, 2, 3, 4, 5,", max_tokens=10, temperature=0)
    assert "7" in free.choices[0].text
    cut = c.completions.create(model="m", prompt="1, 2, 3, 4, 5,", max_tokens=10, temperature=0, stop=[" 7"])
    assert cut.choices[0].finish_reason == "stop" and free.choices[0].text.startswith(cut.choices[0].text)
    assert " 7" not in cut.choices[0].text and cut.usage.prompt_tokens == free.usage.prompt_tokens > 0
    chat = [{"role": "user", "content": "Write a short poem about the sea."}]
    c.chat.completions.create(model="m", messages=chat, max_tokens=1)  # 提示词先进前缀缓存（第 8 章：seed 的保证）
    a, b, other = (c.chat.completions.create(model="m", messages=chat, max_tokens=12, temperature=1.0, seed=s)
                   for s in (7, 7, 8))
    assert a.choices[0].message.content == b.choices[0].message.content != other.choices[0].message.content


def free_ports(n: int = 3) -> int:
    """n 个连续空闲端口里的第一个：--dist-init-addr 的 PORT..PORT+2 都要用。"""
    while True:
        port = free_port()
        try:
            for p in range(port, port + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue

def node_cmd(model: Path, addr: str, rank: int, *flags: str) -> List[str]:
    return [sys.executable, "-m", "minisgl", "--model", str(model), *SERVER_FLAGS, "--tp", "2", "--nnodes", "2",
            "--node-rank", str(rank), "--dist-init-addr", addr, *flags]

def spawned(proc: subprocess.Popen) -> List[psutil.Process]:
    return [w for w in psutil.Process(proc.pid).children(recursive=True) if "--multiprocessing-fork" in w.cmdline()]

def test_two_nodes_equal_tp1(server, tiny_qwen3: Path, tmp_path: Path) -> None:
    """--tp 2 分在两个"节点"上（两个启动器，loopback 上的 gloo）：openai 客户端拿到的贪心结果与 TP=1 的服务相同；
    只有节点 0 有 API Server 和分词进程；再来一个 --node-rank 1 的节点：马上以一行错误退出，节点 0 照常服务；
    节点 0 收到 SIGTERM，节点 1 跟着以 0 退出，两边都不留子进程。"""
    addr, log1 = f"127.0.0.1:{free_ports()}", tmp_path / "node1.log"
    node1 = subprocess.Popen(node_cmd(tiny_qwen3, addr, 1), stdout=log1.open("w"), stderr=subprocess.STDOUT,
                             start_new_session=True)  # 先起节点 1：它等节点 0
    node0 = None
    try:
        node0, port = start_server(tiny_qwen3, tmp_path / "node0.log", "--tp", "2", "--nnodes", "2",
                                   "--node-rank", "0", "--dist-init-addr", addr)
        tp1, tp2 = client(server[0]), client(port)
        for prompt in PROMPTS:
            kw: Dict[str, Any] = dict(model="m", prompt=prompt, max_tokens=12, temperature=0,
                                      extra_body={"ignore_eos": True})
            assert tp2.completions.create(**kw).choices[0].text == tp1.completions.create(**kw).choices[0].text
        kw = dict(model="m", messages=[{"role": "user", "content": "你好"}], max_tokens=10, temperature=0)
        assert tp2.chat.completions.create(**kw).choices[0].message.content == \
            tp1.chat.completions.create(**kw).choices[0].message.content
        w0, w1 = spawned(node0), spawned(node1)
        assert (len(w0), len(w1)) == (2, 1)  # 节点 0：TP0 调度器 + detokenizer；节点 1：只有 TP1 调度器
        late = subprocess.run(node_cmd(tiny_qwen3, addr, 1), capture_output=True, text=True, timeout=120)
        out = (late.stdout + late.stderr).strip()
        assert late.returncode == 1 and len(out.splitlines()) == 1, out
        assert "node 0 refused this node: all 2 nodes have already joined" in out, out
        assert tp2.chat.completions.create(**kw).choices[0].message.content  # 节点 0 照常服务
        node0.send_signal(signal.SIGTERM)
        assert node0.wait(timeout=30) == 0
        assert node1.wait(timeout=30) == 0 and "node 0 is shutting down" in log1.read_text(), log1.read_text()[-2000:]
        _, alive = psutil.wait_procs(w0 + w1, timeout=10)
        assert not alive, [w.cmdline() for w in alive]
    finally:
        for proc in (node0, node1):
            if proc is not None:
                stop_server(proc)

def test_multinode_bad_flags_and_unreachable_addr(tiny_qwen3: Path, capsys) -> None:
    """多节点 flag 的坏组合：一行 error、以 2 退出。没人应答的 --dist-init-addr：节点 1 连不上节点 0、节点 0 等不到
    节点 1，都在 --dist-timeout 内以一行以 --dist-init-addr 开头的错误、退出码 1 结束（还没起任何工作进程）。"""
    from minisgl.server.args import parse_args

    bad = {"--tp 3 --nnodes 2 --dist-init-addr 127.0.0.1:5000": "--tp 3 is invalid with --nnodes 2",
           "--tp 2 --nnodes 2 --node-rank 2 --dist-init-addr 127.0.0.1:5000": "--node-rank 2 is invalid",
           "--tp 2 --nnodes 2": "--dist-init-addr is required with --nnodes 2",
           "--tp 2 --nnodes 2 --dist-init-addr 127.0.0.1": "--dist-init-addr '127.0.0.1' is invalid"}
    for flags, msg in bad.items():
        with pytest.raises(SystemExit) as e:
            parse_args(["--model", str(tiny_qwen3), *flags.split()])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith(f"error: {msg}") and err.count("\n") == 1, err
    addrs = {rank: f"127.0.0.1:{free_ports()}" for rank in (0, 1)}  # 两个地址上都没有别的节点
    procs = {rank: subprocess.Popen(node_cmd(tiny_qwen3, addr, rank, "--dist-timeout", "2", "--port",
                                             str(free_port())), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True) for rank, addr in addrs.items()}
    want = {1: f"--dist-init-addr {addrs[1]}: node 0 did not answer within 2 s",
            0: f"--dist-init-addr {addrs[0]}: node(s) [1] did not join within 2 s"}
    for rank, proc in procs.items():
        out = proc.communicate(timeout=120)[0].strip()
        assert proc.returncode == 1 and want[rank] in out and len(out.splitlines()) == 1, out

def test_nodes_with_different_models_are_refused(tiny_qwen3: Path, tmp_path: Path) -> None:
    """两个节点的模型目录同名、config.json 不同（这里只差 RMSNorm 的 eps：形状都一样，集合通信对得上，答案却是错的；
    差在层数上时，第一个请求要等 gloo 超时才报错）：节点 0 在起任何工作进程之前拒绝，说出是哪个设置。两边都以 1
    退出。"""
    other = tmp_path / "copy" / tiny_qwen3.name
    shutil.copytree(tiny_qwen3, other)
    config = json.loads((other / "config.json").read_text())
    config["rms_norm_eps"] *= 10
    (other / "config.json").write_text(json.dumps(config))
    addr = f"127.0.0.1:{free_ports()}"
    procs = [subprocess.Popen(node_cmd(model, addr, rank, "--port", str(free_port())), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for rank, model in ((0, tiny_qwen3), (1, other))]
    outs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [1, 1], outs
    assert "node 1 was started with --model (its config.json, sha256)" in outs[0], outs[0][-2000:]
    assert "node 0 refused this node" in outs[1], outs[1][-2000:]

def start_pair(model: Path, tmp_path: Path) -> Tuple[subprocess.Popen, subprocess.Popen, int]:
    """两个节点（各自一个进程组），等节点 0 的 /health 回 200：(节点 0, 节点 1, 节点 0 的 HTTP 端口)。"""
    addr = f"127.0.0.1:{free_ports()}"
    node1 = subprocess.Popen(node_cmd(model, addr, 1), stdout=(tmp_path / "node1.log").open("w"),
                             stderr=subprocess.STDOUT, start_new_session=True)
    try:
        node0, port = start_server(model, tmp_path / "node0.log", "--tp", "2", "--nnodes", "2", "--node-rank", "0",
                                   "--dist-init-addr", addr)
    except BaseException:
        stop_server(node1)
        raise
    return node0, node1, port

def test_node_1_gone_mid_answer(tiny_qwen3: Path, tmp_path: Path) -> None:
    """节点 1 在回答的半路被 kill -9：流以一个说出 "node 1 went away" 的 error 事件结束，节点 0 以 1 退出。节点 0
    的 TP0 死在下一次集合通信里（gloo：connection reset by peer），只记一行，日志里没有 traceback——启动器等它
    自己退出（至多 NODE_GONE_GRACE 秒）才收拾，机器再忙也是这个先后。"""
    node0, node1, port = start_pair(tiny_qwen3, tmp_path)
    try:
        frames: List[Dict[str, Any]] = []
        body = {"prompt": "hello", "max_tokens": 240, "ignore_eos": True, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    frames.append(json.loads(line[6:]))
                    if len(frames) == 5:
                        os.killpg(node1.pid, signal.SIGKILL)
        assert "node 1 went away" in frames[-1]["error"]["message"] and len(frames) < 240, frames[-3:]
        assert node0.wait(timeout=60) == 1
        out = (tmp_path / "node0.log").read_text()
        assert "TP0: another rank went away during a collective" in out and "Traceback" not in out, out[-3000:]
    finally:
        stop_server(node0)
        stop_server(node1)

def test_node_0_failing_stops_node_1_with_its_code(tiny_qwen3: Path, tmp_path: Path) -> None:
    """节点 0 的 detokenizer 死了：节点 0 以 1 退出，并把这个退出码告诉节点 1，节点 1 也以 1 退出（Ctrl-C 停下
    节点 0 时两边都是 0，见 test_two_nodes_equal_tp1）。两边都没有 traceback，不留子进程。"""
    node0, node1, _ = start_pair(tiny_qwen3, tmp_path)
    try:
        workers = spawned(node0) + spawned(node1)
        detok = [w for w in spawned(node0) if not w.net_connections(kind="tcp")]  # TP0 连着 gloo，detokenizer 只用 ipc
        assert len(detok) == 1, [w.net_connections(kind="tcp") for w in spawned(node0)]
        detok[0].kill()
        assert (node0.wait(timeout=60), node1.wait(timeout=60)) == (1, 1)
        logs = [(tmp_path / f"node{rank}.log").read_text() for rank in (0, 1)]
        assert "minisgl-detokenizer exited with code -9" in logs[0], logs[0][-3000:]
        assert "node 0 is shutting down (exit code 1)" in logs[1], logs[1][-3000:]
        assert not any("Traceback" in log for log in logs), logs
        _, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, [w.cmdline() for w in alive]
    finally:
        stop_server(node0)
        stop_server(node1)


def test_bad_flags_and_worker_failing_to_start(tmp_path: Path, tiny_qwen3: Path) -> None:
    """坏的参数值：一行 error 并以 2 退出；一个工作进程就绪前就死了：清楚的错误、非零退出码、不留子进程。"""
    bad = subprocess.run([sys.executable, "-m", "minisgl", "--model", str(tiny_qwen3), "--page-size", "0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --page-size 0 is invalid: it must be >= 1"
    with socket.socket() as busy:  # 被占的端口：加载模型、拉起工作进程之前就是一行错误
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        taken = subprocess.run([sys.executable, "-m", "minisgl", "--model", str(tiny_qwen3), "--port", str(port)],
                               capture_output=True, text=True, timeout=120)
    assert taken.returncode == 2 and taken.stdout == "", taken.stdout
    assert taken.stderr.strip() == f"error: --host 127.0.0.1 --port {port}: cannot listen there: Address already in use"
    p = subprocess.run([sys.executable, "-m", "minisgl", "--model", str(tiny_qwen3), "--port", str(free_port()),
                        "--attn", "fi", "--device", "cpu"], capture_output=True, text=True, timeout=240)
    out = p.stdout + p.stderr
    assert p.returncode == 1 and "minisgl-TP0-scheduler exited with code 2 before it was ready" in out, out[-2000:]
    assert "--attn fi needs a CUDA device" in out and "Traceback" not in out, out[-2000:]  # 一行原因，没有 traceback
    p = subprocess.run([sys.executable, "-m", "minisgl", "--model", str(tiny_qwen3), "--port", str(free_port()),
                        "--max-running-requests", "100000000"], capture_output=True, text=True, timeout=240)
    out = p.stdout + p.stderr  # 一亿个请求槽：页表要几百 GiB，分配之前就说
    assert p.returncode == 1 and "--max-running-requests 100000000 needs a page table of" in out, out[-2000:]
    assert "Traceback" not in out, out[-2000:]
    no_weights, bad_config = tmp_path / "no-weights", tmp_path / "bad-config"
    for folder in (no_weights, bad_config):  # 模型目录里只有配置和分词器
        folder.mkdir()
        for f in tiny_qwen3.iterdir():
            if not f.name.endswith(".safetensors"):
                shutil.copy(f, folder / f.name)
    (bad_config / "config.json").write_text("{bad json")
    for flags, message in [(["--device", "tpu"], "--device 'tpu' is invalid"),
                           (["--dist-timeout", "nan"], "--dist-timeout nan is invalid: it must be a finite number > 0"),
                           (["--num-tokenizer", "100000"], "--num-tokenizer 100000 is invalid: it must be in 0..64"),
                           (["--num-threads", "100000"], "--num-threads 100000 is invalid: it must be in 1..1024"),
                           (["--api-key", ""], "--api-key is invalid: it must not be empty"),  # "$KEY" 没设
                           (["--model", str(no_weights)], "has no *.safetensors weights (--dummy-weight starts with"),
                           (["--model", str(bad_config)], "config.json")]:  # 工作进程起来之前就是一行错误
        p = subprocess.run([sys.executable, "-m", "minisgl", "--model", str(tiny_qwen3), *flags], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 2 and p.stderr.startswith("error: ") and message in p.stderr, (flags, p.stderr[-2000:])
        assert "Traceback" not in p.stderr and p.stderr.count("\n") == 1, (flags, p.stderr[-2000:])

def test_ctrl_c_stops_the_server_quietly(tmp_path: Path, tiny_qwen3: Path) -> None:
    """终端里的 Ctrl-C：SIGINT 发给整个进程组，按两次。只有启动器响应，几秒内以 0 退出，不留子进程，输出里没有
    traceback（工作进程要是也响应，它们各打一段；uvicorn 要是记下第二个 SIGINT，收尾时再打一段）。"""
    proc, port = start_server(tiny_qwen3, tmp_path / "server.log")
    workers = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # 再按一次（timeout 命令转发 SIGINT 时也是两次）
    assert_quiet_exit(proc, workers, tmp_path / "server.log")

def assert_quiet_exit(proc: subprocess.Popen, workers: List[psutil.Process], log: Path) -> None:
    """服务被 Ctrl-C 停下之后：以 0 退出，工作进程都不在了，日志里没有 traceback 和 CancelledError。"""
    assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, [w.cmdline() for w in alive]
    out = log.read_text()
    assert "Traceback" not in out and "CancelledError" not in out, out[-3000:]

def test_ctrl_c_held_down_while_starting(tmp_path: Path, tiny_qwen3: Path) -> None:
    """服务还在启动（调度器刚就绪，启动器正要起 HTTP 服务）时按住 Ctrl-C：一秒里每 20 ms 一个 SIGINT 发给整个进程
    组。以 0 退出，不留子进程，没有 traceback。不然，落在 asyncio 和 uvicorn 接管信号之间的那一个让 asyncio 取消
    启动到一半的 uvicorn（一段 CancelledError），落在收尾（kill_workers）半路的那一个是一段 KeyboardInterrupt、
    退出码 -2。"""
    log = tmp_path / "server.log"
    proc, _ = spawn_server(tiny_qwen3, log)
    deadline = time.monotonic() + 120
    while "Scheduler is ready" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.005)
    workers = psutil.Process(proc.pid).children(recursive=True)
    for _ in range(50):
        with contextlib.suppress(ProcessLookupError):  # 启动器已经退出了
            os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.02)
    assert_quiet_exit(proc, workers, log)

def test_ctrl_c_answers_the_requests_in_flight(tmp_path: Path, tiny_qwen3: Path) -> None:
    """Ctrl-C 时还有请求在算：非流式的回 503（OpenAI 的错误体），流式的以一个 error 事件结束。不然 uvicorn 体面关闭的
    2 秒用完就取消它们：纯文本的 500、每个请求一段 traceback、流截在半路。以 0 退出，不留子进程。"""
    log = tmp_path / "server.log"
    proc, port = start_server(tiny_qwen3, log, "--max-seq-len-override", "4096", "--num-pages", "16384")
    workers = psutil.Process(proc.pid).children(recursive=True)
    url = f"http://127.0.0.1:{port}/v1/completions"
    body = {"prompt": "hello", "max_tokens": 4000, "ignore_eos": True, "temperature": 0}  # 要算好几十秒

    async def interrupt_mid_answer() -> Tuple[httpx.Response, List[Dict[str, Any]]]:
        async with httpx.AsyncClient(timeout=60) as client:
            plain = asyncio.create_task(client.post(url, json=body))
            frames: List[Dict[str, Any]] = []
            async with client.stream("POST", url, json={**body, "stream": True}) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        frames.append(json.loads(line[6:]))
                        if len(frames) == 20:  # 两个请求都在 decode 了
                            os.killpg(proc.pid, signal.SIGINT)
            return await plain, frames

    plain, frames = asyncio.run(interrupt_mid_answer())
    assert plain.status_code == 503, plain.text
    assert plain.json()["error"]["type"] == "server_error" and "shutting down" in plain.json()["error"]["message"]
    assert "shutting down" in frames[-1]["error"]["message"] and len(frames) < 1000, frames[-3:]
    assert_quiet_exit(proc, workers, log)

def test_sigterm_leaves_no_orphans(smol_server) -> None:
    """SIGTERM 给主进程：所有工作进程都跟着退出，resource tracker 也没有报告泄漏的信号量（这个模块里最后一个用
    smol_server 的测试）。"""
    proc = RUNNING[smol_server[0]]
    workers = psutil.Process(proc.pid).children(recursive=True)  # 也包括 resource tracker：等它说完再读日志
    assert len([w for w in workers if "--multiprocessing-fork" in w.cmdline()]) == 4  # 调度器、detokenizer、2 个 tokenizer
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, [w.cmdline() for w in alive]
    log = LOGS[smol_server[0]].read_text()
    assert "leaked" not in log and "Traceback" not in log, log[-2000:]

def test_worker_death_gives_503(server) -> None:
    """服务中杀掉调度器：请求回 503（不挂起），主进程以 1 退出，其余工作进程也退出（最后一个用 server 的测试）。"""
    port, _ = server
    proc = RUNNING[port]
    workers = psutil.Process(proc.pid).children(recursive=True)
    spawned = [w for w in workers if "--multiprocessing-fork" in w.cmdline()]
    scheduler = min(spawned, key=lambda w: w.create_time())  # 第一个启动的工作进程：调度器
    scheduler.kill()
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "hi"}, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error", r.text
    except httpx.TransportError:
        pass  # 主进程已经关掉了服务：也没有挂起
    assert proc.wait(timeout=30) == 1
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, [w.cmdline() for w in alive]


def test_abort_goes_to_the_tokenizer_of_its_request(tmp_path: Path) -> None:
    """--num-tokenizer 2：同一个 uid 的 TokenizeMsg 和 AbortMsg 总是发给同一个 tokenizer，中止排在请求后面。
    （PUSH 轮流分发的话，中止会落到另一个 tokenizer 上，可能比请求先到调度器。）"""
    from minisgl.core import SamplingParams
    from minisgl.message import TokenizeMsg
    from minisgl.server.api_server import APIError, FrontendManager
    from minisgl.server.args import ServerArgs
    from minisgl.utils.mp import ZmqAsyncPullQueue, ZmqAsyncPushQueue, ZmqPullQueue

    args = ServerArgs(model_path=tmp_path, num_tokenizer=2, zmq_tokenizer_addr=f"ipc://{tmp_path}/tok")
    pulls = [ZmqPullQueue(addr, create=False) for addr in args.tokenizer_addrs]

    async def send() -> None:
        state = FrontendManager(args, [ZmqAsyncPushQueue(a, create=True) for a in args.tokenizer_addrs],
                                ZmqAsyncPullQueue(f"ipc://{tmp_path}/front", create=True))
        for uid in state.new_users(6):
            await state.send_one(TokenizeMsg(uid=uid, text="hi", sampling_params=SamplingParams()))
        await state.abort_users([1, 2, 5])
        state.dead = "stopping"  # 服务在关闭：发不出去的新请求回 503，它的登记不留在等回复的表里
        uid = state.new_users()[0]
        with pytest.raises(APIError, match="shutting down"):
            await state.send_one(TokenizeMsg(uid=uid, text="hi", sampling_params=SamplingParams()))
        assert uid not in state.ack_map and uid not in state.event_map and uid not in state.start_time
        state.shutdown()

    asyncio.run(send())
    got = [[(type(m).__name__, m.uid) for m in (pull.get(timeout=10) for _ in range(n))]
           for pull, n in zip(pulls, (4, 5))]
    assert got[0] == [("TokenizeMsg", 0), ("TokenizeMsg", 2), ("TokenizeMsg", 4), ("AbortMsg", 2)]
    assert got[1] == [("TokenizeMsg", 1), ("TokenizeMsg", 3), ("TokenizeMsg", 5), ("AbortMsg", 1), ("AbortMsg", 5)]
    for pull in pulls:
        pull.stop()

@pytest.fixture(scope="module")
def dummy_server(tiny_qwen3: Path, tmp_path_factory) -> Iterator[Tuple[subprocess.Popen, int]]:
    """--dummy-weight 的服务，模型目录里只有配置和分词器（没有权重文件），一个单独的 tokenizer 进程：test_new_flags
    问它一个请求，然后 test_kill_9_of_the_launcher_leaves_no_worker kill -9 它的启动器（起一个服务，两个测试用）。"""
    bare = tmp_path_factory.mktemp("no-weights")
    for f in tiny_qwen3.iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copy(f, bare / f.name)
    proc, port = start_server(bare, tmp_path_factory.mktemp("dummy") / "server.log", "--dummy-weight",
                              "--num-tokenizer", "1")
    yield proc, port
    stop_server(proc)

def test_new_flags(dummy_server, tiny_qwen3: Path, capsys) -> None:
    """--num-threads、--dummy-weight、--cpu-kv-memory-mb 在 --help 里；只对另一种设备有意义的 flag、注册表里没有的后端名一行报错；
    --dummy-weight 不读权重文件：一个只有配置和分词器的目录也能起服务、回答请求；刚起来的服务，/metrics 报出整个池。"""
    from minisgl.server.args import build_parser, parse_args

    help_text = build_parser().format_help()
    assert all(f in help_text for f in ("--num-threads", "--dummy-weight", "--cpu-kv-memory-mb", "--memory-ratio"))
    args = parse_args(["--model", str(tiny_qwen3), "--device", "cpu", "--num-threads", "3", "--cpu-kv-memory-mb", "64",
                       "--dummy-weight", "--moe-backend", "torch"])
    assert (args.num_threads, args.cpu_kv_memory_mb, args.use_dummy_weight, args.moe_backend) == (3, 64, True, "torch")
    for flags, msg in [("--num-threads 0", "--num-threads 0 is invalid"),
                       ("--device cpu --memory-ratio 0.5", "--memory-ratio applies on a GPU only"),
                       ("--attn flashinfer", "argument --attn/--attention-backend: invalid choice: 'flashinfer'"),
                       ("--moe-backend fused", "argument --moe-backend: invalid choice: 'fused'")]:
        with pytest.raises(SystemExit) as e:
            parse_args(["--model", str(tiny_qwen3), *flags.split()])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith(f"error: {msg}"), err
    m = metrics(dummy_server[1])  # 第一个请求之前：整个池都是空闲页（调度器启动时推过一次统计）
    assert m["minisgl_kv_pages_free"] > 0 and m["minisgl_kv_pages_used"] == m["minisgl_kv_pages_cached"] == 0, m
    r = client(dummy_server[1]).completions.create(model="m", prompt="hi", max_tokens=3, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3

def test_kill_9_of_the_launcher_leaves_no_worker(dummy_server) -> None:
    """kill -9 启动器：它来不及收拾，工作进程（调度器、detokenizer、tokenizer）自己在几秒之内退出（最后一个用
    dummy_server 的测试）。"""
    proc = dummy_server[0]
    workers = spawned(proc)
    assert len(workers) == 3
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    _, alive = psutil.wait_procs(workers, timeout=5)
    assert not alive, [w.cmdline() for w in alive]


def test_shell_in_a_terminal(tiny_qwen3: Path) -> None:
    """--shell 在伪终端里：提示符、流式的回答、回答时的 Ctrl-C 只停这个回答（工作进程还在，下一问照常回答）、
    /reset、/exit。"""
    pexpect = pytest.importorskip("pexpect")
    env = dict(os.environ, PROMPT_TOOLKIT_NO_CPR="1", TERM="dumb")
    sh = pexpect.spawn(sys.executable, ["-m", "minisgl", "--model", str(tiny_qwen3), "--shell",
                                        "--max-seq-len-override", "1024"],  # 随机的小模型停不下来：写到上下文满
                       env=env, timeout=240, encoding="utf-8")
    try:
        sh.expect("/reset")  # 开头的帮助行
        sh.expect("> ")
        sh.sendline("hello")
        sh.expect("hello")  # 回显的输入行
        sh.expect(r"\S")  # 回答开始了
        sh.sendintr()  # Ctrl-C：发给整个进程组
        sh.expect(r"\(stopped\)", timeout=60)
        sh.expect("> ")
        sh.sendline("hello again")
        sh.sendline("/reset")  # 回答完才会读到它
        sh.expect(r"\(history cleared\)", timeout=120)
        sh.sendline("word " * 1100)  # 比上下文（1024）还长：被拒绝，说出原因，不进历史
        sh.expect(r"\(refused: .*1024.*/reset clears the history\)", timeout=60)
        sh.expect("> ")
        sh.sendline("/help")  # 命令不发给模型
        sh.expect("/help 显示这一行")
        sh.sendline("hi")  # 被拒绝的那一问没有留在历史里：这一问照常回答
        sh.expect("hi")
        sh.expect(r"\S")
        sh.sendintr()
        sh.expect(r"\(stopped\)", timeout=60)
        sh.sendline("/exit")
        sh.expect(pexpect.EOF, timeout=30)
    finally:
        sh.close(force=True)
    assert sh.exitstatus == 0
