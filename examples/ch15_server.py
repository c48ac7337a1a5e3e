# Tangled from book/chapters/ch15_server.ipynb — edit the notebook, not this file.
"""第 15 章：启动完整的服务，用 OpenAI 客户端访问。"""

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
from openai import OpenAI

from minisgl.utils.hf import example_model_path

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
model = str(example_model_path())  # 下载过 models/Qwen3-0.6B 就用它，否则用内置的 SmolLM2
proc = subprocess.Popen(
    [sys.executable, "-m", "minisgl", "--model", model, "--port", str(port), "--num-pages", "4096",
     "--max-seq-len-override", "1024"],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
try:
    t = time.time()
    while True:
        assert proc.poll() is None, f"the server exited with code {proc.returncode}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    children = psutil.Process(proc.pid).children(recursive=True)
    workers = [c for c in children if "--multiprocessing-fork" in c.cmdline()]
    print(f"服务就绪（约 {time.time() - t:.0f} 秒）：主进程（API Server）+ {len(workers)} 个工作进程"
          f"（调度器、兼做分词的 detokenizer）")
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
    name = client.models.list().data[0].id

    r = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
        max_tokens=48, temperature=0)
    print("非流式:", repr(r.choices[0].message.content), r.choices[0].finish_reason, dict(r.usage or {}))

    stream = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "Count from 1 to 5."}],
        max_tokens=24, temperature=0, stream=True)
    chunks = [c.choices[0].delta.content for c in stream if c.choices[0].delta.content]
    print(f"流式: 收到 {len(chunks)} 个片段:", chunks[:12], "...")

    def ask(i: int) -> float:
        t0 = time.perf_counter()
        client.chat.completions.create(model=name, messages=[{"role": "user", "content": f"{i}+{i}=?"}],
                                       max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
        return time.perf_counter() - t0

    ask(0)  # 预热
    t0 = time.perf_counter()
    single = ask(1)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as ex:
        lat = list(ex.map(ask, range(8)))
    print(f"单个请求（16 个 token）{single:.2f}s；8 个并发请求总用时 {time.perf_counter() - t0:.2f}s，"
          f"单个 {min(lat):.2f}～{max(lat):.2f}s")

    r = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "Give me a name for a cat."}], max_tokens=12,
        temperature=0.8, n=2, seed=1)
    print("n=2:", [(c.index, c.message.content) for c in r.choices], dict(r.usage.prompt_tokens_details or {}))
    try:
        client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}],
                                       tools=[{"type": "function", "function": {"name": "f"}}])
    except Exception as e:  # openai.BadRequestError
        print("tools:", type(e).__name__, e.body["message"])
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    print("\n".join(line for line in metrics.splitlines()
                    if line.startswith(("minisgl_num_", "minisgl_kv_pages", "minisgl_generation_tokens"))))
finally:
    os.killpg(proc.pid, signal.SIGKILL)
