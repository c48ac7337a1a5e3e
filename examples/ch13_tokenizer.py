# Tangled from book/chapters/ch13_tokenizer.ipynb — edit the notebook, not this file.
"""第 13 章：对话模板、流式反分词、stop 字符串；增量解码与每步全量重解码的开销；ZMQ 上的分词进程。"""

import multiprocessing as mp
import random
import tempfile
import time
from typing import Any, List

from minisgl.core import SamplingParams
from minisgl.message import BatchFrontendMsg, BatchTokenizerMsg, DetokenizeMsg, TokenizeMsg, UserMsg, UserReply
from minisgl.tokenizer import DetokenizeManager, TokenizeManager, tokenize_worker
from minisgl.utils.hf import default_model_path, load_tokenizer, qwen3_tokenizer_dir
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue


def stream(tok: Any, ids: List[int], stop: List[str] = []) -> List[UserReply]:
    """把 ids 一个一个送进 DetokenizeManager（最后一个带 finished），收集每一步的回复。"""
    d = DetokenizeManager(tok)
    d.add_request(0, stop=stop)
    replies = []
    for i, t in enumerate(ids):
        r = d.detokenize(DetokenizeMsg(uid=0, next_token=t, finished=i == len(ids) - 1, finish_reason="length"))
        replies.append(r)
        if r.finished:
            break
    return replies


def redecode_all(tok: Any, ids: List[int]) -> List[str]:
    """对照组：每来一个 token 就把全部输出重新解码，减去已经发出的部分。"""
    out, sent = [], ""
    for i in range(len(ids)):
        full = tok.decode(ids[: i + 1], skip_special_tokens=True)
        if not full.endswith("\ufffd") or i == len(ids) - 1:
            out.append(full[len(sent):])
            sent = full
    return out


def main() -> None:
    qwen_path, smol_path = qwen3_tokenizer_dir(), default_model_path()
    qwen, smol = load_tokenizer(qwen_path), load_tokenizer(smol_path)

    # 1. 对话模板
    chat = [{"role": "system", "content": "用中文回答。"}, {"role": "user", "content": "1+1=?"}]
    for name, tok, options in [("Qwen3", qwen, {}), ("Qwen3", qwen, {"enable_thinking": False}),
                               ("SmolLM2", smol, {})]:
        manager = TokenizeManager(tok)
        msg = manager.tokenize(TokenizeMsg(uid=0, text=chat, sampling_params=SamplingParams(), chat_options=options))
        print(f"{name} {options}: {len(msg.input_ids)} 个 token（{msg.input_ids.dtype}）\n  "
              f"{manager.render(chat, options)!r}")

    # 2. 流式反分词：每个 token 到达时发出的文字；stop 字符串
    text = "你好，世界！🌏 Hello👋🏽"
    for name, tok in [("Qwen3", qwen), ("SmolLM2", smol)]:
        ids = tok.encode(text)
        pieces = [r.incremental_output for r in stream(tok, ids)]
        assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True)
        print(f"\n{name}：{len(ids)} 个 token → {pieces}")
        print(f"  逐个单独解码：{[tok.decode([t]) for t in ids]}")
    ids = smol.encode("Thought: I know it.\nObservation: 42\nFinal answer: 42")
    replies = stream(smol, ids, stop=["Observation:"])
    print(f"\nstop=['Observation:']：送进 {len(replies)}/{len(ids)} 个 token 后结束（{replies[-1].finish_reason}），"
          f"输出 {''.join(r.incremental_output for r in replies)!r}")

    # 3. 长输出：增量解码 vs 每步重新解码全部输出（主角是 1000 个 token）
    rng = random.Random(0)
    words = "推理引擎 把 请求 分成 预填充 和 解码 两个 阶段 the scheduler batches requests 🚀 KV cache 页 表".split()
    all_ids = smol.encode(" ".join(rng.choice(words) for _ in range(3600)))
    print("\n逐 token 流式解码一段输出（SmolLM2 分词器，中英文和 emoji 混排），每个 token 平均花多少时间：")
    print("| 输出长度 | 增量（本章） | 每步重新解码全部 | 倍数 | 拼起来等于一次性解码 |")
    print("|---------:|-------------:|-----------------:|-----:|:--------------------:|")
    for n in (250, 1000, 4000):
        ids = all_ids[:n]
        assert len(ids) == n
        one_shot = smol.decode(ids, skip_special_tokens=True)
        per_token = []
        for fn in (lambda: [r.incremental_output for r in stream(smol, ids)], lambda: redecode_all(smol, ids)):
            times = []
            for _ in range(3 if n <= 1000 else 1):
                t0 = time.perf_counter()
                pieces = fn()
                times.append(time.perf_counter() - t0)
            assert "".join(pieces) == one_shot
            per_token.append(min(times) / n)
        print(f"| {n} | {per_token[0] * 1e6:.1f} µs | {per_token[1] * 1e6:.1f} µs | "
              f"{per_token[1] / per_token[0]:.0f}× | True |")

    # 4. 一个分词进程（--num-tokenizer 0：分词、反分词在同一个进程里），经 ZMQ 收发
    tmp = tempfile.mkdtemp()
    addr, backend_addr, frontend_addr = f"ipc://{tmp}/tok", f"ipc://{tmp}/backend", f"ipc://{tmp}/frontend"
    backend: ZmqPullQueue = ZmqPullQueue(backend_addr, create=True)
    frontend: ZmqPullQueue = ZmqPullQueue(frontend_addr, create=True)
    ctx = mp.get_context("spawn")
    ack = ctx.Queue()
    proc = ctx.Process(target=tokenize_worker, kwargs=dict(
        tokenizer_path=str(qwen_path), addr=addr, create=True, backend_addr=backend_addr,
        frontend_addr=frontend_addr, tokenizer_id=0, ack_queue=ack))
    t0 = time.perf_counter()
    proc.start()
    print(f"\n{ack.get(timeout=120)}（启动用了 {time.perf_counter() - t0:.1f} s）")
    send: ZmqPushQueue = ZmqPushQueue(addr, create=False)
    try:
        send.put(TokenizeMsg(uid=7, text=[{"role": "user", "content": "数到三"}], sampling_params=SamplingParams(),
                             chat_options={"enable_thinking": False}, stop=["三"]))
        user = backend.get(timeout=60)
        assert isinstance(user, UserMsg)
        print(f"调度器收到 UserMsg(uid={user.uid})，{len(user.input_ids)} 个 token：{qwen.decode(user.input_ids)!r}")
        answer = qwen.encode("一、二、三。") + [qwen.convert_tokens_to_ids("<|im_end|>")]
        send.put(BatchTokenizerMsg([DetokenizeMsg(uid=7, next_token=t, finished=False) for t in answer]))
        got = frontend.get(timeout=60)
        replies = got.data if isinstance(got, BatchFrontendMsg) else [got]
        print("API Server 收到：", [(r.incremental_output, r.finished, r.finish_reason) for r in replies])
        print(f"  最后一条的 usage：prompt_tokens={replies[-1].prompt_tokens}，"
              f"completion_tokens={replies[-1].completion_tokens}")
        print("调度器收到：", backend.get(timeout=60))
    finally:
        proc.terminate()
        proc.join(30)
        for q in (send, backend, frontend):
            q.stop()


if __name__ == "__main__":  # spawn 出来的子进程会导入 main 模块：只有真正的 main 才往下跑
    main()
