# Tangled from book/chapters/ch01_skeleton.ipynb and ch04_moe.ipynb and ch09_continuous_batching.ipynb — edit the notebooks, not this file.
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    """@pytest.mark.gpu 的测试在没有 CUDA 的机器上跳过。"""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


TINY = dict(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
            initializer_range=0.5, rms_norm_eps=1e-6)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 256}


def make_tiny_model(kind: str, path: Path, seed: int = 0, **overrides) -> Path:
    """一个随机初始化的小模型目录：config.json + model.safetensors（fp32）+ 真实的 Qwen3 分词器。

    overrides 改写 config 的字段（比如 head_dim=128）：FlashInfer 这类 GPU kernel 只接受 64/128/256 的 head_dim。
    """
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from minisgl.utils.hf import qwen3_tokenizer_dir

    if kind == "qwen3":  # head_dim 32 ≠ hidden/heads：检验显式 head_dim 的路径；共享词嵌入
        fields = dict(TINY, head_dim=32, tie_word_embeddings=True)
        config_cls, cls = Qwen3Config, Qwen3ForCausalLM
    elif kind == "llama":  # llama3 的 RoPE 缩放；不共享词嵌入
        fields = dict(TINY, rope_parameters=LLAMA3_ROPE, tie_word_embeddings=False)
        config_cls, cls = LlamaConfig, LlamaForCausalLM
    elif kind == "qwen3_moe":
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        fields = dict(TINY, head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                      norm_topk_prob=True, decoder_sparse_step=1, tie_word_embeddings=False)
        config_cls, cls = Qwen3MoeConfig, Qwen3MoeForCausalLM
    else:
        raise ValueError(f"unknown tiny model kind {kind!r}")
    config = config_cls(**{**fields, **overrides})
    torch.manual_seed(seed)
    model = cls(config).to(torch.float32).eval()
    model.generation_config.eos_token_id = None  # 贪心对比时不要提前停
    model.generation_config.pad_token_id = None
    model.save_pretrained(path)
    for f in qwen3_tokenizer_dir().iterdir():
        shutil.copy(f, path / f.name)
    return path


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory) -> Path:
    return make_tiny_model("qwen3", tmp_path_factory.mktemp("tiny_qwen3"))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return make_tiny_model("llama", tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def tiny_qwen3_moe(tmp_path_factory) -> Path:
    return make_tiny_model("qwen3_moe", tmp_path_factory.mktemp("tiny_qwen3_moe"))


# 同样的结构，head_dim 换成 GPU 注意力 kernel（FlashInfer）接受的 64 / 128
@pytest.fixture(scope="session")
def tiny_qwen3_hd128(tmp_path_factory) -> Path:
    return make_tiny_model("qwen3", tmp_path_factory.mktemp("tiny_qwen3_hd128"), head_dim=128)


@pytest.fixture(scope="session")
def tiny_llama_hd64(tmp_path_factory) -> Path:  # hidden 256、4 个头 → head_dim 64，2 个 KV 头
    return make_tiny_model("llama", tmp_path_factory.mktemp("tiny_llama_hd64"), hidden_size=256,
                           num_attention_heads=4, num_key_value_heads=2)


@pytest.fixture(scope="session")
def tiny_qwen3_moe_hd128(tmp_path_factory) -> Path:
    return make_tiny_model("qwen3_moe", tmp_path_factory.mktemp("tiny_qwen3_moe_hd128"), head_dim=128)


@pytest.fixture(scope="session")
def tp1():
    """单进程的测试：TP 位置是 rank 0 / 共 1 个。构造层和模型的测试模块写 pytestmark = usefixtures("tp1")。"""
    from minisgl.distributed import set_tp_info

    return set_tp_info(0, 1)


@pytest.fixture(scope="session")
def smollm2() -> Path:
    from minisgl.utils.hf import default_model_path

    return default_model_path()


def run_interpreted(module: str, function: str) -> None:
    """在 TRITON_INTERPRET=1 的子进程里调用 tests/<module>.py 的 function()：CPU 上用 Triton 的解释器逐行执行
    kernel。子进程导入同一棵树里的 minisgl（这一章的树），失败时把它的 stderr 带回来。"""
    import os
    import subprocess
    import sys

    import minisgl

    pytest.importorskip("triton")
    root = Path(minisgl.__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", f"import {module} as t; t.{function}()"], cwd=Path(__file__).parent,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]


def mixed_workload(seed: int = 0, n: int = 64, vocab: int = 5000):
    """n 个长短不一的请求：奇数号的共享 4 个 24-token 前缀之一（前缀缓存能命中），各生成 1–10 个 token。"""
    import random

    from minisgl.core import SamplingParams

    rng = random.Random(seed)
    prefixes = [[rng.randrange(100, vocab) for _ in range(24)] for _ in range(4)]
    prompts, params = [], []
    for i in range(n):
        tail = [rng.randrange(100, vocab) for _ in range(rng.randint(1, 40))]
        prompts.append((prefixes[i % 4] if i % 2 else []) + tail)
        params.append(SamplingParams(max_tokens=rng.randint(1, 10), ignore_eos=True))
    return prompts, params


# 每个模型一起提交多少个请求（mixed_workload 的前 n 个）：SmolLM2 是真实权重，CPU 上每一步都要把 0.5 GB 权重读一遍，
# 单独跑一遍参照答案就要半分钟，所以它只跑前 32 个
NUM_REQUESTS = {"tiny_qwen3": 64, "smollm2": 32}


def generate_alone(path, prompts, params, **config):
    """参照答案：每个请求单独跑（一个请求槽、不复用前缀）。config 可以换设备（GPU 测试）。"""
    from minisgl.llm import LLM

    llm = LLM(path, **{"device": "cpu", **config}, max_running_req=1, cache_type="naive", num_pages=1024,
              max_seq_len_override=256)
    try:
        return [llm.generate([p], [s], use_tqdm=False)[0]["token_ids"] for p, s in zip(prompts, params)]
    finally:
        llm.shutdown()


def check_batched(path, prompts, params, ref, page_size: int = 1, **config) -> None:
    """一起提交，两轮，逐 token 等于参照；每轮之后资源全部回来；清空缓存后所有页空闲。"""
    from minisgl.llm import LLM

    llm = LLM(path, **{"device": "cpu", **config}, page_size=page_size, num_pages=4096 // page_size,
              max_running_req=64, max_seq_len_override=256)
    try:
        for _ in range(2):  # 第二轮：第一轮的前缀已经在缓存里
            got = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
            assert got == ref, [i for i, (g, r) in enumerate(zip(got, ref)) if g != r]
            assert llm.table.num_free == 64 and not llm.running
            llm.cache.check_integrity()
        if config.get("cache_type", "radix") == "radix":
            assert llm.cache.hit_tokens > 0, "the second round should hit the prefix cache"
        llm.cache.flush()
        assert len(llm.cache.free_pages) == llm.cache.num_pages, "flushing the cache frees every page"
    finally:
        llm.shutdown()


@pytest.fixture(scope="session")
def reference():
    """reference(path, n)：mixed_workload(n=n) 的每个请求单独跑出的 token（参照答案，同一个模型和 n 只算一次）。

    环境变量 BOOK_TEST_SHARE 是一个目录时（tools/book.py nbval、steps.py test 每次运行新建一个），第 9、10、11 章
    共用参照答案：先算出来的那一章把它写进这个目录（键是模型文件内容的哈希和 n），后面的章直接读。SmolLM2 的参照
    答案单独跑一遍要半分钟；后面的章拿自己的批处理结果和它逐 token 比较，要求不变。"""
    import hashlib
    import json
    import os

    cache = {}
    share = os.environ.get("BOOK_TEST_SHARE")

    def shared_file(path, n: int):
        if not share or not os.path.isdir(share):
            return None
        h = hashlib.sha256()
        for f in sorted(Path(path).iterdir()):
            if f.suffix in (".json", ".safetensors"):
                with open(f, "rb") as fh:
                    h.update(f.name.encode() + hashlib.file_digest(fh, "sha256").digest())
        return Path(share) / f"reference-{h.hexdigest()[:20]}-n{n}.json"

    def get(path, n: int = 64):
        if (path, n) not in cache:
            file = shared_file(path, n)
            if file is not None and file.exists():
                cache[path, n] = json.loads(file.read_text())
            else:
                cache[path, n] = generate_alone(path, *mixed_workload(n=n))
                if file is not None:  # 先写临时文件再改名：同时在算的另一章读不到写了一半的文件
                    tmp = file.with_name(f"{file.name}.{os.getpid()}")
                    tmp.write_text(json.dumps(cache[path, n]))
                    os.replace(tmp, file)
        return cache[path, n]

    return get


def collecting_scheduler(config):
    """一个收下所有回复的调度器：.replies 是全部回复，.finished() 是 uid → 结束原因（同一个请求结束两次就失败）。"""
    from minisgl.scheduler import Scheduler

    class Collect(Scheduler):
        def __init__(self) -> None:
            super().__init__(config)
            self.replies = []

        def send_result(self, replies) -> None:
            self.replies.extend(replies)

        def finished(self) -> dict:
            done = {}
            for r in self.replies:
                if r.finished:
                    assert r.uid not in done, f"request {r.uid} finished twice"
                    done[r.uid] = r.finish_reason
            return done

    return Collect()


class RetractionRig:
    """反复撤回的性质测试：一个很小的 KV 池（正好装下一个 max_seq_len 的请求），接纳的估计调到最乐观（只按已知的
    token 接纳），于是几乎每个场景都要撤回；共享 4 个 token 就让请求等一等，好让"等共享前缀"也混进来。参照答案是
    同一个调度器上每个请求单独跑出的 token。"""

    MAX_LEN = 48

    def __init__(self, path, page_size: int, **config) -> None:
        import minisgl.scheduler.prefill as prefill
        from minisgl.scheduler import SchedulerConfig

        self._prefill = prefill
        self._saved = (prefill.INIT_TOKEN_RATIO, prefill.MIN_TOKEN_RATIO, prefill.SHARE_TOKENS)
        prefill.INIT_TOKEN_RATIO = prefill.MIN_TOKEN_RATIO = 0.0
        prefill.SHARE_TOKENS = 4
        self.s = collecting_scheduler(SchedulerConfig(path, device="cpu", page_size=page_size,
                                                      num_pages=self.MAX_LEN // page_size, max_running_req=6,
                                                      max_seq_len_override=self.MAX_LEN, **config))
        self._alone = {}
        self.retracted = 0

    def close(self) -> None:
        self._prefill.INIT_TOKEN_RATIO, self._prefill.MIN_TOKEN_RATIO, self._prefill.SHARE_TOKENS = self._saved
        self.s.shutdown()

    def _drive(self, overlap: bool) -> bool:
        return self.s.overlap_step() if overlap else self.s.step()

    def alone(self, ids, max_tokens: int):
        """这个请求单独跑（池子里没有别的请求）生成的 token。"""
        key = (tuple(ids), max_tokens)
        if key not in self._alone:
            from minisgl.core import SamplingParams
            from minisgl.message import UserMsg

            s, uid = self.s, -1 - len(self._alone)
            seen = len(s.replies)
            s.receive_msg(UserMsg(uid, torch.tensor(ids, dtype=torch.int32),
                                  SamplingParams(max_tokens=max_tokens, ignore_eos=True)))
            while s.step():
                pass
            self._alone[key] = [r.next_token for r in s.replies[seen:] if r.uid == uid and r.next_token >= 0]
            del s.replies[seen:]
        return self._alone[key]

    def run(self, scenario, overlap: bool = False, budget: int = 8192) -> None:
        """按场景提交、中止请求，一步步跑完；每一步之后检查页的账。然后：每个请求恰好结束一次、结束后没有 token；
        没被中止的与单独运行逐 token 相同，被中止的是它的前缀；槽和页全部回来。"""
        import random
        from dataclasses import replace

        from minisgl.core import SamplingParams
        from minisgl.message import AbortBackendMsg, UserMsg

        s, L = self.s, self.MAX_LEN
        s.config = replace(s.config, max_extend_tokens=budget)
        rng = random.Random(scenario["seed"])
        prefixes = [[rng.randrange(100, 5000) for _ in range(rng.randint(8, 20))] for _ in range(2)]
        reqs = []
        for r in scenario["reqs"]:
            ids = (prefixes[r["prefix"] - 1] if r["prefix"] else []) + [rng.randrange(100, 5000) for _ in range(r["tail"])]
            ids = ids[:L - 1]
            limit = L - len(ids) if r["max_tokens"] is None else min(r["max_tokens"], L - len(ids))
            ref = self.alone(ids, limit)
            stop = ref[r["pick"] % len(ref)] if r["stop"] != "none" else None
            if r["stop"] == "token":  # 停止 token：单独运行时在它第一次出现处停下
                ref = ref[:ref.index(stop) + 1]
            sp = SamplingParams(max_tokens=10**6 if r["max_tokens"] is None else r["max_tokens"], ignore_eos=True,
                                stop_token_ids=[stop] if r["stop"] == "token" else [])  # 10**6：截到上下文的上限
            reqs.append(dict(r, ids=ids, sp=sp, ref=ref, trigger=stop if r["stop"] == "string" else None))
        base, seen, step = s.num_retracted, len(s.replies), 0
        last_event = max(max(r["arrive"], r["abort"] or 0) for r in reqs)
        with torch.inference_mode():
            while True:
                for uid, r in enumerate(reqs):
                    if r["arrive"] == step:
                        s.receive_msg(UserMsg(uid, torch.tensor(r["ids"], dtype=torch.int32), r["sp"]))
                    if r["abort"] == step:
                        s.receive_msg(AbortBackendMsg(uid))
                busy = self._drive(overlap)
                s.cache.check_integrity()
                for m in s.replies[seen:]:  # "停止词"：反分词进程看到它就发中止（这里在下一步之前发）
                    if m.next_token >= 0 and m.next_token == reqs[m.uid]["trigger"]:
                        s.receive_msg(AbortBackendMsg(m.uid))
                seen = len(s.replies)
                step += 1
                if not busy and step > last_event:
                    break
        got = {uid: [] for uid in range(len(reqs))}
        done = {}
        for m in s.replies:
            if m.uid < 0:
                continue
            assert m.uid not in done, f"request {m.uid} got a reply after it finished"
            if m.next_token >= 0:
                got[m.uid].append(m.next_token)
            if m.finished:
                done[m.uid] = m.finish_reason
        s.replies.clear()
        assert sorted(done) == list(range(len(reqs))), f"unfinished: {set(range(len(reqs))) - set(done)}"
        for uid, r in enumerate(reqs):
            ref = r["ref"]
            if done[uid] == "abort":
                assert got[uid] == ref[:len(got[uid])], (uid, got[uid], ref)
            else:
                assert got[uid] == ref, (uid, done[uid], got[uid], ref)
        assert not s.running and s.table.num_free == s.table.max_running_req
        s.cache.flush()
        assert len(s.cache.free_pages) == s.cache.num_pages, "flushing the cache frees every page"
        self.retracted += s.num_retracted - base


def retraction_scenarios():
    """hypothesis 的策略：2–6 个请求，提示词长短不一（一半共享两个前缀之一），max_tokens 给或不给，在随机的步
    到达、被中止；有的带停止 token，有的带"停止词"（看到某个 token 就被中止，像反分词进程那样）。"""
    from hypothesis import strategies as st

    req = st.fixed_dictionaries(dict(
        prefix=st.integers(0, 2), tail=st.integers(1, 16), max_tokens=st.one_of(st.none(), st.integers(1, 40)),
        arrive=st.integers(0, 12), abort=st.one_of(st.none(), st.integers(0, 60)),
        stop=st.sampled_from(["none", "none", "token", "string"]), pick=st.integers(0, 99)))
    return st.fixed_dictionaries(dict(seed=st.integers(0, 2**16), reqs=st.lists(req, min_size=2, max_size=6)))


def check_retraction(path, page_size: int, max_examples: int, overlaps=(False,), budgets=(8192,)) -> None:
    """在 max_examples 个随机场景上跑 RetractionRig.run，最后要求确实撤回过。"""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    rig = RetractionRig(path, page_size)

    @settings(max_examples=max_examples, deadline=None, derandomize=True, database=None)
    @given(retraction_scenarios(), st.sampled_from(overlaps), st.sampled_from(budgets))
    def run(scenario, overlap, budget) -> None:
        rig.run(scenario, overlap, budget)

    try:
        run()
        assert rig.retracted > 0, "the scenarios never ran the pool dry"
    finally:
        rig.close()


def check_failed_step_recovers(path, overlap: bool = False) -> None:
    """一步算到半路抛了异常（第 3 次前向，模拟显存不够）：generate 原样抛出它，请求槽、页、收结果的字典全部回来；
    同一个 LLM 接着生成的 token 与新建的一样。overlap：重叠调度（第 11 章起才有这个开关）。"""
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    kw = dict(device="cpu", page_size=4, num_pages=256, max_running_req=4, max_seq_len_override=128,
              **({"enable_overlap": True} if overlap else {}))
    prompts = [list(range(10 + i, 30 + i)) for i in range(6)]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    llm = LLM(path, **kw)
    forward, calls = llm.engine.model.forward, [0]

    def failing(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("simulated: out of memory")
        return forward(*args, **kwargs)

    llm.engine.model.forward = failing
    with pytest.raises(RuntimeError, match="simulated"):
        llm.generate(prompts, params, use_tqdm=False)
    del llm.engine.model.forward
    assert not llm.has_work and llm.table.num_free == 4 and not llm._outputs and not llm._done
    llm.cache.check_integrity()
    got = llm.generate(prompts, params, use_tqdm=False)
    llm.cache.flush()
    assert len(llm.cache.free_pages) == 256
    llm.shutdown()
    fresh = LLM(path, **kw)
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in fresh.generate(prompts, params, use_tqdm=False)]
    fresh.shutdown()
