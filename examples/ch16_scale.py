# Tangled from book/chapters/ch16_scale.ipynb — edit the notebook, not this file.
"""附录：两个 minisgl 副本躲在 SGLang 的路由器后面（tools/serve_dp.py），用 OpenAI 客户端访问。"""

import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import httpx
import psutil
from openai import OpenAI

try:
    import sglang_router  # noqa: F401
except ImportError:
    sys.exit('这个例子需要 SGLang 的路由器：pip install -e ".[scale]"')


with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
out = Path(tempfile.mkdtemp(prefix="minisgl-ch16-")) / "serve_dp.out"
proc = subprocess.Popen([sys.executable, "tools/serve_dp.py", "2", "--policy", "cache_aware", "--port", str(port),
                         "--num-pages", "4096", "--max-seq-len-override", "2048"],
                        stdout=out.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
try:
    while "ready:" not in out.read_text():
        assert proc.poll() is None, f"serve_dp.py exited with code {proc.returncode}:\n{out.read_text()}"
        time.sleep(0.5)
    text = out.read_text()
    replicas = re.findall(r"^replica \d+: (\S+)", text, re.M)
    router = re.search(r"^router \(cache_aware\): (\S+)", text, re.M).group(1)
    print(f"{len(replicas)} 个副本，路由器登记了 {httpx.get(f'{router}/workers').json()['total']} 个 worker")

    info = httpx.get(f"{replicas[0]}/get_model_info").json()
    print("/get_model_info:", {k: info[k] for k in ("model_type", "architectures", "is_generation")})
    server = httpx.get(f"{replicas[0]}/get_server_info").json()
    print("/get_server_info:", {k: server[k] for k in ("tp_size", "dp_size", "page_size", "max_total_num_tokens")})
    print("  internal_states:", server["internal_states"][0])

    def metrics(url: str) -> Dict[str, float]:
        text = httpx.get(f"{url}/metrics").text
        return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if not line.startswith("#")}

    def served() -> List[float]:  # 每个副本结束了多少请求
        return [sum(v for k, v in metrics(u).items() if k.startswith("minisgl_requests_finished_total"))
                for u in replicas]

    def cached() -> List[float]:  # 每个副本的前缀缓存累计命中了多少 token
        return [metrics(u)["minisgl_cached_tokens_total"] for u in replicas]

    manual = ("You answer questions about the Aurora 3 home battery. Facts: capacity 13.5 kWh; continuous power "
              "5 kW, peak 7 kW for ten seconds; round-trip efficiency 90 percent; warranty ten years or 4000 cycles, "
              "whichever comes first; operating temperature from minus 20 to 50 degrees Celsius; it must be installed "
              "on a wall or on the floor, never in a bathroom; a full charge from the grid takes about three hours. ")
    client = OpenAI(base_url=f"{router}/v1", api_key="none")
    messages = [{"role": "system", "content": manual}]
    first = None
    for turn, question in enumerate(["How much energy does it store?", "And how long is the warranty?",
                                     "Can I put it in my bathroom?"], 1):
        messages.append({"role": "user", "content": question})
        n0, c0 = served(), cached()
        r = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=40, temperature=0)
        answer = r.choices[0].message.content
        time.sleep(0.5)  # 调度器空下来时把统计推给 API Server
        n1, c1 = served(), cached()
        where = next(i for i in range(len(replicas)) if n1[i] > n0[i])
        first = where if first is None else first
        hits = int(c1[where] - c0[where])
        print(f"第 {turn} 轮：{'第一次去的那个副本' if where == first else '另一个副本'}，"
              f"提示词 {r.usage.prompt_tokens} 个 token，其中 {hits} 个命中前缀缓存；回答 {answer!r}")
        if turn < 3:
            messages.append({"role": "assistant", "content": answer})

    direct = [OpenAI(base_url=f"{u}/v1", api_key="none").chat.completions.create(
        model="smollm2", messages=messages, max_tokens=40, temperature=0).choices[0].message.content
        for u in replicas]
    print("直接问两个副本，回答和经过路由器的相同：", direct == [answer, answer])
finally:
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)  # 和 Ctrl-C 一样：先停路由器，再停副本
    code = proc.wait(timeout=60)
    _, alive = psutil.wait_procs(children, timeout=15)
    print(f"serve_dp.py 以 {code} 退出，留下的子进程：{len(alive)} 个（启动过 {len(children)} 个）")
