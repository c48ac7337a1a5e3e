# Tangled from book/chapters/ch16_scale.ipynb — edit the notebook, not this file.
"""附录：两个内置 SmolLM2 的副本躲在 sglang-router 后面（tools/serve_dp.py）：路由器要问的接口、经过路由器的贪心
结果与直接问副本相同、共享长前缀的请求落在同一个副本上（round_robin 则两边各算一遍）、SIGTERM 不留子进程。"""
from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Tuple

import httpx
import psutil
import pytest
from openai import OpenAI

pytest.importorskip("sglang_router", reason="sglang-router is not installed: pip install -e '.[scale]'")

TOOLS = Path(__file__).resolve().parent.parent / "tools"
sys.path.insert(0, str(TOOLS))
import serve_dp  # noqa: E402  (tools/serve_dp.py：再起一个 round_robin 路由器要用它)

FLAGS = ["--num-pages", "2048", "--max-seq-len-override", "1024"]
Fleet = Tuple[subprocess.Popen, str, List[str]]

@pytest.fixture(scope="module")
def fleet(smollm2: Path, tmp_path_factory) -> Iterator[Fleet]:
    """python tools/serve_dp.py 2 --policy cache_aware：等它打印 ready 行，读出路由器和两个副本的地址。"""
    logs = tmp_path_factory.mktemp("dp")
    out = logs / "serve_dp.out"
    proc = subprocess.Popen([sys.executable, str(TOOLS / "serve_dp.py"), "2", "--policy", "cache_aware",
                             "--port", str(serve_dp.free_port()), "--log-dir", str(logs), "--model", str(smollm2),
                             *FLAGS], stdout=out.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 400
    while "ready:" not in out.read_text():
        assert proc.poll() is None, f"serve_dp.py exited with code {proc.returncode}:\n{out.read_text()}"
        assert time.time() < deadline, f"serve_dp.py was not ready:\n{out.read_text()}"
        time.sleep(0.3)
    text = out.read_text()
    replicas = re.findall(r"^replica \d+: (\S+)", text, re.M)
    router = re.search(r"^router \(cache_aware\): (\S+)", text, re.M).group(1)
    yield proc, router, replicas
    if proc.poll() is None:  # 最后一个测试已经用 SIGTERM 停掉了它；出错时这里兜底
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)

def client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)

def metrics(url: str) -> Dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if not line.startswith("#")}

def finished(url: str) -> float:
    return sum(v for k, v in metrics(url).items() if k.startswith("minisgl_requests_finished_total"))

def cached(url: str) -> float:
    return metrics(url)["minisgl_cached_tokens_total"]

def ask(url: str, system: str, question: str, max_tokens: int = 4):
    return client(url).chat.completions.create(
        model="smollm2", messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        max_tokens=max_tokens, temperature=0)

def settle(read: Callable[[], List[float]], seconds: float = 3.0) -> List[float]:
    """调度器空下来时才推统计：读到连续两次相同为止（最多 seconds 秒）。"""
    last, deadline = read(), time.time() + seconds
    while time.time() < deadline:
        time.sleep(0.3)
        now = read()
        if now == last:
            return now
        last = now
    return last


QUESTIONS = ["What is the first rule?", "Summarize the text.", "Who wrote this?", "Give one example."]

def manual(topic: str) -> str:
    """一段约 250 个 token 的长 system prompt，每个测试一个主题（互不共享前缀）。"""
    return " ".join(f"Rule {i} of the {topic} handbook: every {topic} step must be written down and checked twice."
                    for i in range(12))

def test_shared_prefix_lands_on_one_replica(fleet: Fleet) -> None:
    """cache_aware：共享长前缀的 4 个请求都去同一个副本，它的命中数涨了至少 3 个前缀，另一个不涨；
    round_robin（另起一个路由器）：同样的请求两边各 2 个，两个副本各自算一遍前缀。"""
    _, router, replicas = fleet
    n0 = [finished(u) for u in replicas]
    c0 = settle(lambda: [cached(u) for u in replicas])
    system = manual("lighthouse")
    prompt = min(ask(router, system, q).usage.prompt_tokens for q in QUESTIONS)
    prefix = prompt - 20  # 对话模板 + system prompt 是共享的；问题和结尾的几个 token 不是
    n1 = [finished(u) for u in replicas]
    c1 = settle(lambda: [cached(u) for u in replicas])
    served = [b - a for a, b in zip(n0, n1)]
    hits = [b - a for a, b in zip(c0, c1)]
    assert sorted(served) == [0, 4], served
    hot = served.index(4)
    assert hits[hot] >= 3 * prefix and hits[1 - hot] == 0, (hits, prefix)

    with serve_dp.running_router(replicas, "round_robin") as rr:
        system = manual("bakery")
        for q in QUESTIONS:
            ask(rr.url, system, q)
        n2 = [finished(u) for u in replicas]
        c2 = settle(lambda: [cached(u) for u in replicas])
    assert [b - a for a, b in zip(n1, n2)] == [2, 2]
    assert all(b - a >= prefix for a, b in zip(c1, c2)), (c1, c2, prefix)  # 每边第 2 个请求命中第 1 个的前缀


def test_workers_answer_the_router(fleet: Fleet, smollm2: Path) -> None:
    """路由器登记了两个 worker；/get_model_info、/get_server_info 如实回答；/metrics 有命中计数器。"""
    _, router, replicas = fleet
    workers = httpx.get(f"{router}/workers", timeout=10).json()["workers"]
    assert sorted(w["url"] for w in workers) == sorted(replicas) and all(w["is_healthy"] for w in workers)
    info = httpx.get(f"{replicas[0]}/get_model_info", timeout=10).json()
    assert info["model_path"] == str(smollm2) and info["is_generation"] is True
    assert info["model_type"] == "llama" and info["architectures"] == ["LlamaForCausalLM"]
    server = httpx.get(f"{replicas[1]}/get_server_info", timeout=10).json()
    assert server["port"] == int(replicas[1].rsplit(":", 1)[1]) and server["tp_size"] == 1 and server["dp_size"] == 1
    assert server["max_total_num_tokens"] == 2048 * server["page_size"]  # --num-pages 2048
    assert not any(k.startswith(("zmq_", "api_key")) for k in server)
    state = server["internal_states"][0]
    assert state["num_running_reqs"] == 0 and state["kv_pages_used"] == 0
    assert "minisgl_cached_tokens_total" in metrics(replicas[0])

def test_same_greedy_answers_through_the_router(fleet: Fleet) -> None:
    """官方 openai 客户端：经过路由器的贪心回答和直接问每个副本的逐字相同。"""
    _, router, replicas = fleet
    for question in ["What is the capital of France?", "Name three colors.", "Write a haiku about rain."]:
        answers = [client(u).chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": question}], max_tokens=24,
            temperature=0).choices[0].message.content for u in [router, *replicas]]
        assert answers[0] and answers == [answers[0]] * 3, answers

def test_busy_router_port_is_one_line(tmp_path: Path) -> None:
    """路由器的端口被占着：serve_dp.py 在起任何副本之前以一行错误、退出码 2 结束（不然要等副本加载完，再看
    路由器的 traceback）。"""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([sys.executable, str(TOOLS / "serve_dp.py"), "2", "--port", str(port), "--log-dir",
                               str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr == f"serve_dp.py: error: --host 127.0.0.1 --port {port}: the router cannot listen there: " \
                          "Address already in use\n", done.stderr
    assert not list(tmp_path.iterdir())  # 没有起过副本：一个日志都没有

def test_sigterm_stops_everything(fleet: Fleet) -> None:
    """SIGTERM 给 serve_dp.py：它以 0 退出，路由器、两个副本和它们的工作进程都不在了（本模块最后一个测试）。"""
    proc = fleet[0]
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len([c for c in children if "sglang" in " ".join(c.cmdline())]) == 1  # 路由器把进程名改成 sglang::router
    assert len([c for c in children if "--multiprocessing-fork" in c.cmdline()]) == 4  # 每个副本：调度器、detokenizer
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, [c.cmdline() for c in alive]
