# Tangled from book/chapters/ch11_overlap.ipynb — edit the notebook, not this file.
"""第 11 章：重叠调度关与开——同样的输出、每一步的时间，以及 CPU 调度工作与模型工作的时间线。"""

import argparse
import gc
import json
import os
import random
import tempfile
import time
from typing import Dict, List

import torch

from minisgl.core import SamplingParams
from minisgl.llm import LLM


class Timeline(LLM):
    """记下每一步的三段 CPU 工作（挑批、提交、处理结果）和模型的工作（GPU 上用 CUDA event 量）。"""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.spans: List[tuple] = []  # (lane, start, end)，秒
        self._cuda = self.engine.device.type == "cuda"
        if self._cuda:
            torch.cuda.synchronize()
            self._base_event, self._base_time = torch.cuda.Event(enable_timing=True), time.perf_counter()
            self._base_event.record()
        self._gpu: List[tuple] = []

    def schedule_next_batch(self):
        t = time.perf_counter()
        batch = super().schedule_next_batch()
        self.spans.append(("cpu", t, time.perf_counter()))
        return batch

    def launch(self, batch):
        t = time.perf_counter()
        if self._cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        step = super().launch(batch)
        now = time.perf_counter()
        if self._cuda:
            end.record()
            self._gpu.append((start, end))
            self.spans.append(("cpu", t, now))  # GPU 上提交是 CPU 的工作，计算在 GPU 上
        else:
            self.spans.append(("model", t, now))  # CPU 上提交就是把前向算完
        return step

    def process(self, step):
        if step.out.copy_done_event is not None:
            step.out.copy_done_event.synchronize()  # 等待不算工作：先等完再计时
        t = time.perf_counter()
        super().process(step)
        self.spans.append(("cpu", t, time.perf_counter()))

    def timeline(self) -> List[tuple]:
        spans = list(self.spans)
        if self._cuda:
            torch.cuda.synchronize()
            for start, end in self._gpu:
                spans.append(("model", self._base_time + self._base_event.elapsed_time(start) / 1000,
                              self._base_time + self._base_event.elapsed_time(end) / 1000))
        return spans


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "ch11_timeline.json"),
                    help="write the timelines here (JSON)")
    args, _ = ap.parse_known_args()  # 在 Jupyter 内核里运行时，sys.argv 里是内核自己的参数
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 20000) for _ in range(rng.randint(16, 64))] for _ in range(args.requests)]
    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True)
    result: Dict[str, dict] = {}
    outputs = {}
    for overlap in (False, True):
        llm = Timeline(args.model, enable_overlap=overlap, page_size=16, max_running_req=args.requests,
                       max_seq_len_override=512)
        llm.generate(prompts[:2], SamplingParams(max_tokens=4), use_tqdm=False)  # 预热（含 CUDA Graph）
        llm.spans.clear()
        llm._gpu.clear()
        t0 = time.perf_counter()
        outputs[overlap] = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
        dt = time.perf_counter() - t0
        spans = [(lane, a - t0, b - t0) for lane, a, b in llm.timeline()]
        steps = sum(1 for lane, _, _ in spans if lane == "model")
        name = "开" if overlap else "关"
        total = args.requests * args.tokens
        result[name] = dict(seconds=dt, steps=steps, spans=spans, device=str(llm.engine.device))
        print(f"重叠{name}: {steps} 步，{dt:.2f}s，每步 {dt / steps * 1000:.1f} ms，{total / dt:.0f} token/s")
        llm.shutdown()
        del llm  # 先放掉这个引擎的 KV 池（GPU 上它占了大部分显存），下一个引擎才有地方
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if outputs[False] != outputs[True]:
        raise SystemExit("overlap on and off must give the same tokens")
    print("两种调度的输出逐 token 相同:", outputs[False] == outputs[True])
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
