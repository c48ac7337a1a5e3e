#!/usr/bin/env python3
"""What each scheduler feature buys, measured on CPU with the embedded SmolLM2-135M (or, with --gpu, on a GPU
with random weights in the Qwen3-0.6B config, at larger sizes).

    python benchmarks/bench_features.py continuous [--quick]   # continuous vs static batching, mixed output lengths
    python benchmarks/bench_features.py prefix [--quick]       # radix vs naive prefix cache, multi-turn chat
    python benchmarks/bench_features.py chunked [--quick]      # decode gaps while long prompts arrive, chunked or not
    python benchmarks/bench_features.py overlap [--quick]      # overlap scheduling on vs off, decode-heavy
    python benchmarks/bench_features.py shared [--quick]       # one long system prompt, N requests arriving together
    python benchmarks/bench_features.py admission [--quick]    # chat outputs of unknown length: estimate vs reserve
    python benchmarks/bench_features.py chunked --gpu           # any of them on cuda (Qwen3-0.6B config, random bf16)

Each subcommand prints one small table. Token times come from LLM.send_result (overridden to timestamp each
token as the scheduler hands it out); steps are counted by wrapping Scheduler.launch. The machine is shared
and small: the numbers move from run to run, the comparison within one run is what to read.
"""
from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository's minisgl (resolve(): a chapter tree links benchmarks/ here)

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402
from minisgl.message import AbortBackendMsg, UserMsg  # noqa: E402
from minisgl.utils.hf import default_model_path, load_tokenizer  # noqa: E402


class TimedLLM(LLM):
    """LLM that timestamps every token it hands out, and counts the steps it launches."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.times: Dict[int, List[float]] = {}  # uid -> perf_counter of each output token
        self.submitted: Dict[int, float] = {}
        self.steps = {"prefill": 0, "decode": 0}
        self.prefill_tokens = 0  # tokens sent through the model for requests still in prefill
        self.batch_sizes: List[int] = []  # requests in each launched batch
        self.step_secs: List[float] = []  # wall time of each step (drive() only)
        self.overlap: bool | None = None  # drive(): None = as configured, else force overlap on / off

    def send_result(self, replies) -> None:
        now = time.perf_counter()
        for r in replies:
            if r.next_token >= 0:
                self.times.setdefault(r.uid, []).append(now)
        super().send_result(replies)

    def launch(self, batch, last=None):
        self.steps[batch.phase] += 1
        self.prefill_tokens += sum(r.extend_len for r in batch.reqs if r.uid not in self.decode.running)
        self.batch_sizes.append(batch.size)
        return super().launch(batch, last)

    def one_step(self) -> bool:
        overlap = getattr(self.config, "enable_overlap", False) if self.overlap is None else self.overlap
        return self.overlap_step() if overlap else self.step()

    # -- driving the scheduler by hand (requests arriving while others decode)
    def submit(self, ids: List[int], sp: SamplingParams) -> int:
        uid, self._next_uid = self._next_uid, self._next_uid + 1
        self._outputs[uid] = []
        self.submitted[uid] = time.perf_counter()
        self.receive_msg(UserMsg(uid, torch.tensor(ids, dtype=torch.int32), sp))
        return uid

    def drive(self) -> bool:
        t0 = time.perf_counter()
        with torch.inference_mode():
            busy = self.one_step()
        self.step_secs.append(time.perf_counter() - t0)
        return busy

    def done(self, uid: int) -> bool:
        return uid in self._done


# where to run: set by main() (--gpu: a random Qwen3-0.6B checkpoint on cuda)
RUN = {"model": None, "device": "cpu", "label": "SmolLM2-135M, CPU", "gpu": False, "overlap": None}


def make_llm(**kw) -> TimedLLM:
    """A fresh engine. The previous one must be shut down and unreferenced: its KV pool (most of the GPU's
    memory at the default --memory-ratio) is freed here, before the new engine sizes its pool."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    kw.setdefault("cpu_kv_memory_mb", 1024)
    if RUN["overlap"] is not None:  # --overlap on|off; default: the engine's (on, where the tree has it)
        kw["enable_overlap"] = RUN["overlap"]
    llm = TimedLLM(RUN["model"], device=RUN["device"], **kw)
    llm.generate(["Warm up: the quick brown fox"], SamplingParams(max_tokens=8), use_tqdm=False)
    return llm


def rand_ids(rng: random.Random, n: int) -> List[int]:
    return [rng.randint(100, 9999) for _ in range(n)]


def pct(xs: List[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


# ---------------------------------------------------------------------------------------------- continuous
def cmd_continuous(args) -> None:
    n, B, hi = (16, 4, 64) if args.quick else (256, 64, 512) if RUN["gpu"] else (32, 8, 64)
    rng = random.Random(0)
    prompts = [rand_ids(rng, rng.randint(16, 32)) for _ in range(n)]
    outs = [rng.randint(4, hi) for _ in range(n)]
    params = [SamplingParams(ignore_eos=True, max_tokens=k) for k in outs]
    llm = make_llm(max_running_req=B, cache_type="naive")  # naive: the second run gets no prefix hits
    rows = []
    for mode in ("static", "continuous"):
        llm.steps = {"prefill": 0, "decode": 0}
        t0 = time.perf_counter()
        if mode == "static":  # waves of B: the next wave starts when the whole wave has finished
            for i in range(0, n, B):
                llm.generate(prompts[i:i + B], params[i:i + B], use_tqdm=False)
        else:
            llm.generate(prompts, params, use_tqdm=False)
        secs = time.perf_counter() - t0
        dec = llm.steps["decode"]
        rows.append((mode, sum(outs), secs, dec, (sum(outs) - n) / max(dec, 1)))
    llm.shutdown()
    print(f"\ncontinuous vs static batching: {n} requests, prompts 16-32 tokens, outputs uniform in 4-{hi} "
          f"(sum {sum(outs)}), at most {B} running (max_running_req={B}); {RUN['label']}")
    print(f"{'batching':<11} {'tokens':>6} {'seconds':>8} {'tokens/s':>9} {'decode steps':>12} {'mean batch':>10}")
    for mode, tok, secs, dec, mb in rows:
        print(f"{mode:<11} {tok:>6} {secs:>8.2f} {tok / secs:>9.1f} {dec:>12} {mb:>10.2f}")
    print(f"continuous / static throughput: {rows[0][2] / rows[1][2]:.2f}x")


# ---------------------------------------------------------------------------------------------- prefix
def cmd_prefix(args) -> None:
    convs, turns, answer = (4, 3, 16) if args.quick else (64, 4, 64) if RUN["gpu"] else (8, 4, 24)
    tok = load_tokenizer(RUN["model"] or default_model_path())
    system = ("You are a careful assistant for a small inference-engine workshop. Answer briefly and precisely. "
              "Rules: cite the chapter when you can; prefer code over prose; never invent an API; say when you "
              "do not know; keep answers under three sentences; use SI units; explain one idea at a time; "
              "when asked about performance, name what was measured, on which machine, and how; when asked "
              "about memory, count bytes per token; when asked about scheduling, describe one step of the loop; "
              "when asked about caching, say what is shared and what is private to a request; when asked about "
              "parallelism, say which tensors are split and where the all-reduce happens; when asked about "
              "sampling, say which parameters are per request; when asked about attention kernels, name the "
              "backend and the page size; when a question is ambiguous, ask one short question back; when a "
              "number is an estimate, say so; when the user is wrong, say so politely and show why.")
    topics = ["paged KV cache", "radix trees", "chunked prefill", "CUDA graphs", "overlap scheduling",
              "tensor parallelism", "sampling", "RoPE"]
    first = [tok.apply_chat_template([{"role": "system", "content": system},
                                      {"role": "user", "content": f"Tell me about {topics[c % len(topics)]}."}],
                                     add_generation_prompt=True, tokenize=False) for c in range(convs)]
    followups = ["Why does it matter?", "Give a number.", "What breaks without it?", "Summarize in one line."]
    eos = tok.convert_tokens_to_ids("<|im_end|>")

    def run(cache: str):
        llm = make_llm(cache_type=cache)
        hits0 = llm.cache.hit_tokens
        prompts = [tok.encode(t, add_special_tokens=False) for t in first]
        per_turn = []
        t_all = time.perf_counter()
        for t in range(turns):
            sp = SamplingParams(max_tokens=answer)
            h0 = llm.cache.hit_tokens
            t0 = time.perf_counter()
            outs = llm.generate(prompts, sp, use_tqdm=False)
            uids = sorted(llm.times)[-convs:]  # this round's requests: the newest uids
            ttft = [llm.times[u][0] - t0 for u in uids]
            ptoks = sum(len(p) for p in prompts)
            per_turn.append((t + 1, ptoks / convs, (llm.cache.hit_tokens - h0) / ptoks, statistics.mean(ttft),
                             time.perf_counter() - t0))
            nxt = []
            for p, o in zip(prompts, outs):  # previous prompt + previous answer + the next user message
                ans = [x for x in o["token_ids"] if x != eos]
                user = followups[t % len(followups)]
                nxt.append(p + ans + tok.encode(f"<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
                                                f"<|im_start|>assistant\n", add_special_tokens=False))
            prompts = nxt
        total = time.perf_counter() - t_all
        hits = llm.cache.hit_tokens - hits0
        llm.shutdown()
        return per_turn, hits, total

    res = {c: run(c) for c in ("naive", "radix")}
    ptok_total = sum(r[1] * convs for r in res["radix"][0])
    print(f"\nprefix cache: {convs} conversations x {turns} turns sharing a "
          f"{len(tok.encode(system, add_special_tokens=False))}-token system prompt; each turn = previous prompt "
          f"+ previous answer (<= {answer} tokens) + a new user message; a turn is submitted when the previous one "
          f"returned (all conversations' turn t together); {RUN['label']}")
    print(f"{'turn':>4} {'prompt tokens':>13} {'radix hit rate':>14} {'TTFT naive ms':>13} {'TTFT radix ms':>13}")
    for (t, p, _, tn, _), (_, _, hr, tr, _) in zip(res["naive"][0], res["radix"][0]):
        print(f"{t:>4} {p:>13.0f} {hr:>14.1%} {tn * 1000:>13.0f} {tr * 1000:>13.0f}")
    for c in ("naive", "radix"):
        per_turn, hits, total = res[c]
        print(f"{c:<6}: hit rate {hits / ptok_total:6.1%} of {ptok_total:.0f} prompt tokens, mean TTFT "
              f"{statistics.mean(r[3] for r in per_turn) * 1000:6.0f} ms, total {total:6.2f} s")


# ---------------------------------------------------------------------------------------------- chunked
def cmd_chunked(args) -> None:
    n_dec, dec_out, n_long, long_len, every = (4, 60, 2, 800, 12) if args.quick else \
        (64, 300, 4, 24000, 40) if RUN["gpu"] else (8, 100, 3, 1500, 15)
    rows = []
    for budget in ((32768, 2048) if RUN["gpu"] else (8192, 256)):
        llm = make_llm(max_extend_tokens=budget, cache_type="naive")
        rng = random.Random(0)
        dec = [llm.submit(rand_ids(rng, 16), SamplingParams(ignore_eos=True, max_tokens=dec_out))
               for _ in range(n_dec)]
        longs: List[int] = []
        llm.step_secs = []
        steps = 0
        while not all(llm.done(u) for u in dec + longs):
            # a long prompt arrives every `every` steps once the decoders are running
            if len(longs) < n_long and steps >= every * (len(longs) + 1):
                longs.append(llm.submit(rand_ids(rng, long_len), SamplingParams(ignore_eos=True, max_tokens=4)))
            llm.drive()
            steps += 1
        while llm.drive():
            pass
        gaps = [b - a for u in dec for a, b in zip(llm.times[u], llm.times[u][1:])]
        ttft = [llm.times[u][0] - llm.submitted[u] for u in longs]
        overlap = getattr(llm.config, "enable_overlap", False)
        rows.append((budget, pct(gaps, 0.5), pct(gaps, 0.95), max(gaps), statistics.mean(ttft),
                     max(llm.step_secs), llm.steps["prefill"]))
        llm.shutdown()
        del llm  # make_llm frees its memory before the next engine sizes its KV pool
    print(f"\nchunked prefill: {n_dec} requests decoding {dec_out} tokens each; every {every} steps a "
          f"{long_len}-token prompt arrives ({n_long} in all); gaps between consecutive tokens of the decoding "
          f"requests; {RUN['label']}, overlap {'on' if overlap else 'off'}")
    print(f"{'max_extend_tokens':>17} {'gap p50 ms':>10} {'gap p95 ms':>10} {'gap max ms':>10} "
          f"{'long TTFT ms':>12} {'longest step ms':>15} {'prefill steps':>13}")
    for b, p50, p95, mx, tt, ls, ps in rows:
        print(f"{b:>17} {p50 * 1000:>10.0f} {p95 * 1000:>10.0f} {mx * 1000:>10.0f} {tt * 1000:>12.0f} "
              f"{ls * 1000:>15.0f} {ps:>13}")


# ---------------------------------------------------------------------------------------------- overlap
def cmd_overlap(args) -> None:
    n, prompt, out, reps = (8, 16, 48, 1) if args.quick else (64, 16, 256, 3) if RUN["gpu"] else (16, 16, 64, 3)
    rng = random.Random(0)
    prompts = [rand_ids(rng, prompt) for _ in range(n)]
    sp = SamplingParams(ignore_eos=True, max_tokens=out)
    # one engine (the forward context is process-global: two engines cannot live in one process), driven
    # by hand with Scheduler.overlap_step or Scheduler.step; the two modes alternate to see the same load
    llm = make_llm(cache_type="naive")
    res: Dict[str, List[tuple]] = {"on": [], "off": []}
    for _ in range(reps):
        for m in ("off", "on"):
            llm.overlap = m == "on"
            llm.steps = {"prefill": 0, "decode": 0}
            t0 = time.perf_counter()
            uids = [llm.submit(p, sp) for p in prompts]
            while not all(llm.done(u) for u in uids):
                llm.drive()
            while llm.drive():
                pass
            secs = time.perf_counter() - t0
            assert all(len(llm._outputs[u]) == out for u in uids)
            res[m].append((secs, llm.steps["prefill"] + llm.steps["decode"]))
    llm.shutdown()
    tokens = n * out
    print(f"\noverlap scheduling: {n} requests, {prompt}-token prompts, {out} output tokens each (ignore_eos), "
          f"{reps} run(s) each, alternating; {RUN['label']}" + ("" if RUN["gpu"] else
          " (the 'device' is the same cores as the host)"))
    print(f"{'overlap':<7} {'run':>3} {'steps':>5} {'seconds':>8} {'ms/step':>8} {'tokens/s':>9}")
    for m in ("off", "on"):
        for i, (secs, steps) in enumerate(res[m]):
            print(f"{m:<7} {i + 1:>3} {steps:>5} {secs:>8.2f} {secs / steps * 1000:>8.1f} {tokens / secs:>9.1f}")
    med = {m: statistics.median(s for s, _ in res[m]) for m in res}
    print(f"median on / median off throughput: {med['off'] / med['on']:.2f}x (on CPU the host and the 'device' "
          f"are the same cores, so there is no idle device time for overlap to fill)")


# ---------------------------------------------------------------------------------------------- shared
def cmd_shared(args) -> None:
    """N requests sharing one long system prompt arrive together. 'at finish' emulates the scheduler that inserts a
    request's pages into the radix cache only when it finishes (and never waits for a sharer): every request admitted
    while the first one runs recomputes the system prompt."""
    import minisgl.scheduler.prefill as prefill

    # budget: with 8192 on CPU all 8 requests would be admitted in the first step, and only waiting would help
    n, sys_len, out, budget = (4, 300, 4, 512) if args.quick else (256, 1000, 32, 8192) if RUN["gpu"] else \
        (8, 1000, 16, 2048)
    tok = load_tokenizer(RUN["model"] or default_model_path())
    words = ("scheduler radix cache page prefill decode token batch overlap chunk kernel attention rotary tensor "
             "sampling stream request engine model weights").split()
    rng = random.Random(0)
    system = tok.encode(" ".join(rng.choice(words) for _ in range(2 * sys_len)), add_special_tokens=False)[:sys_len]
    questions = [tok.encode(f" Question {i}: what is {rng.choice(words)} number {rng.randint(0, 999)}?",
                            add_special_tokens=False) for i in range(n)]
    sp = SamplingParams(ignore_eos=True, max_tokens=out)
    rows = []
    for mode in ("at finish", "after prefill", "after prefill + wait"):
        llm = make_llm(cache_type="radix", max_extend_tokens=budget)
        llm.cache.flush()
        saved = prefill.MAX_WAIT_STEPS
        if mode != "after prefill + wait":
            prefill.MAX_WAIT_STEPS = 0  # nobody waits for a sharer
        if mode == "at finish":
            llm.cache.cache_prompt = lambda req: None  # the pages stay the request's until it finishes
        try:
            llm.prefill_tokens = 0
            h0 = llm.cache.hit_tokens
            uids = [llm.submit(system + q, sp) for q in questions]
            t0 = time.perf_counter()
            while not all(llm.done(u) for u in uids):
                llm.drive()
            secs = time.perf_counter() - t0
            while llm.drive():
                pass
        finally:
            prefill.MAX_WAIT_STEPS = saved
        ttft = [llm.times[u][0] - t0 for u in uids]
        rows.append((mode, llm.prefill_tokens, llm.cache.hit_tokens - h0, statistics.median(ttft), max(ttft), secs))
        llm.shutdown()
        del llm
    print(f"\nshared system prompt: {n} requests arrive together, each = the same {len(system)}-token system prompt "
          f"+ a distinct {min(map(len, questions))}-{max(map(len, questions))}-token question, {out} output tokens "
          f"(ignore_eos); at most {budget} prefill tokens a step (max_extend_tokens); the radix cache starts empty; "
          f"{RUN['label']}, overlap "
          f"{'on' if RUN['overlap'] is not False else 'off'}")
    print(f"{'prompt pages enter the cache':<28} {'prefill tokens':>14} {'cache hits':>10} {'TTFT p50 ms':>11} "
          f"{'TTFT max ms':>11} {'seconds':>8}")
    for mode, ptok, hits, p50, mx, secs in rows:
        print(f"{mode:<28} {ptok:>14} {hits:>10} {p50 * 1000:>11.0f} {mx * 1000:>11.0f} {secs:>8.2f}")


# ---------------------------------------------------------------------------------------------- admission
class StopAt(TimedLLM):
    """Each request ends at a length the scheduler cannot foresee: when it has produced `stop_at[uid]` tokens the
    request is aborted before the next step, as the detokenizer does when it sees a stop string."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.stop_at: Dict[int, int] = {}
        self._to_abort: List[int] = []
        self.running_sizes: List[int] = []

    def send_result(self, replies) -> None:
        super().send_result(replies)
        for r in replies:
            if not r.finished and len(self._outputs[r.uid]) == self.stop_at.get(r.uid, -1):
                self._to_abort.append(r.uid)

    def run_step(self) -> bool:
        aborted = bool(self._to_abort)
        for uid in self._to_abort:
            self.receive_msg(AbortBackendMsg(uid))
        self._to_abort.clear()
        self.running_sizes.append(len(self.running))
        # an abort is work done: when the last request ends by one (no step follows), this call still made progress
        return super().run_step() or aborted


def cmd_admission(args) -> None:
    n, lo, hi, ctx, pool = (24, 100, 300, 1024, 4096) if args.quick else \
        (1024, 100, 300, 4096, 64 * 4096) if RUN["gpu"] else (32, 100, 300, 1024, 8192)
    tok = load_tokenizer(RUN["model"] or default_model_path())
    rng = random.Random(0)
    topics = ["paged KV cache", "radix trees", "chunked prefill", "CUDA graphs", "overlap scheduling",
              "tensor parallelism", "sampling", "RoPE", "continuous batching", "prefix caching"]
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Explain {rng.choice(topics)} in detail, "
                                         f"with example {rng.randint(0, 99)}."}],
                                       add_generation_prompt=True, tokenize=True) for _ in range(n)]
    prompts = [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompts]
    lengths = [rng.randint(lo, hi) for _ in range(n)]
    page = 16
    rows = []
    for admission in ("reserve", "optimistic"):
        gc.collect()
        llm = StopAt(RUN["model"], device=RUN["device"], page_size=page, num_pages=pool // page,
                     max_seq_len_override=ctx, max_running_req=256, admission=admission,
                     **({} if RUN["overlap"] is None else {"enable_overlap": RUN["overlap"]}))
        llm.generate(["Warm up: the quick brown fox"], SamplingParams(max_tokens=8), use_tqdm=False)
        llm.running_sizes.clear()
        llm.prefill_tokens = 0
        sps = [SamplingParams(ignore_eos=True, max_tokens=10**6) for _ in prompts]  # 10**6: the rest of the context
        llm.stop_at = {llm._next_uid + i: k for i, k in enumerate(lengths)}
        t0 = time.perf_counter()
        outs = llm.generate(prompts, sps, use_tqdm=False)
        secs = time.perf_counter() - t0
        assert [len(o["token_ids"]) for o in outs] == lengths
        busy = [k for k in llm.running_sizes if k]
        rows.append((admission, sum(lengths), secs, statistics.mean(busy), max(busy), llm.num_retracted,
                     llm.prefill_tokens))
        llm.shutdown()
        del llm
    print(f"\nadmission: {n} chat requests ({min(map(len, prompts))}-{max(map(len, prompts))}-token prompts), "
          f"max_tokens unset (the rest of a {ctx}-token context), each ends after {lo}-{hi} tokens at a stop string "
          f"the scheduler cannot foresee; KV pool {pool} tokens (pages of {page}); {RUN['label']}, overlap "
          f"{'on' if RUN['overlap'] is not False else 'off'}")
    print(f"{'admission':<10} {'tokens':>6} {'seconds':>8} {'tokens/s':>9} {'mean running':>12} {'max running':>11} "
          f"{'retractions':>11} {'prefill tokens':>14}")
    for adm, tokens, secs, mean, most, retracted, ptok in rows:
        print(f"{adm:<10} {tokens:>6} {secs:>8.2f} {tokens / secs:>9.1f} {mean:>12.1f} {most:>11} {retracted:>11} "
              f"{ptok:>14}")
    print(f"optimistic / reserve throughput: {rows[0][2] / rows[1][2]:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, fn, help_ in [("continuous", cmd_continuous, "continuous vs static batching"),
                            ("prefix", cmd_prefix, "radix vs naive prefix cache on multi-turn chat"),
                            ("chunked", cmd_chunked, "decode gaps while long prompts arrive"),
                            ("overlap", cmd_overlap, "overlap scheduling on vs off"),
                            ("shared", cmd_shared, "one long system prompt shared by requests arriving together"),
                            ("admission", cmd_admission, "estimated vs whole-life admission, outputs of unknown length")]:
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("--quick", action="store_true", help="smaller sizes")
        p.add_argument("--gpu", action="store_true", help="cuda, random weights in the Qwen3-0.6B config, larger sizes")
        p.add_argument("--overlap", choices=["on", "off"], default=None,
                       help="overlap scheduling (chapter 11) on or off; default: the engine's default")
        p.add_argument("--threads", type=int, default=1,
                       help="torch CPU threads (default 1: on a shared, oversubscribed machine OpenMP's spinning "
                            "barriers make 2 threads on 2 busy cores ~10x slower than 1)")
        p.set_defaults(fn=fn)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    RUN["overlap"] = None if args.overlap is None else args.overlap == "on"
    if args.gpu and not torch.cuda.is_available():
        raise SystemExit("error: --gpu needs a CUDA GPU, and torch sees none on this machine")
    if args.gpu:
        import shutil
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_offline import random_checkpoint

        RUN.update(model=str(random_checkpoint(Path(__file__).resolve().parent / "configs" / "qwen3-0.6b.json")),
                   device="cuda", label=f"Qwen3-0.6B config (random bf16 weights), {torch.cuda.get_device_name()}",
                   gpu=True)
        try:
            args.fn(args)
        finally:
            shutil.rmtree(RUN["model"], ignore_errors=True)
    else:
        args.fn(args)


if __name__ == "__main__":
    main()
