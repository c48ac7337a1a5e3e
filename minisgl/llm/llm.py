# Tangled from book/chapters/ch09_continuous_batching.ipynb and ch13_tokenizer.ipynb — edit the notebooks, not this file.
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Sequence, Tuple

import torch
from tqdm.auto import tqdm

from minisgl.core import SamplingParams
from minisgl.message import DetokenizeMsg, UserMsg
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.tokenizer import DetokenizeManager, TokenizeManager, nth_sample
from minisgl.utils.hf import load_tokenizer, resolve_model_path

Prompt = str | List[int]
Conversation = List[Dict[str, Any]]  # 一段对话：[{"role": "user", "content": "..."}, ...]


@contextmanager
def sigint_between_steps() -> Iterator[List[bool]]:
    """Ctrl-C（Jupyter 的"中断"）只记一笔，由调用方在两步之间处理：flag[0] 变成 True。一步算到一半抛出的
    KeyboardInterrupt 会让请求槽、页和前缀缓存的账停在半路。信号处理函数只能在主线程里装；别的线程里什么也不改。"""
    flag = [False]
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def on_sigint(signum: int, frame: Any) -> None:
        flag[0] = True

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


class LLM(Scheduler):
    """离线推理：在本进程里跑调度器。LLM(model, **config).generate(prompts, sampling_params)；对话用
    .chat(conversations, sampling_params)。两者都收 n（每个提示词几个回答）和 stop（stop 字符串）。"""

    def __init__(self, model: str | None = None, **config: Any) -> None:
        path = resolve_model_path(model)
        super().__init__(SchedulerConfig(model_path=path, **config))
        self.tokenizer = load_tokenizer(path)
        self.tokenize_manager = TokenizeManager(self.tokenizer)  # 对话模板：和服务用的是同一个
        self.detokenize_manager = DetokenizeManager(self.tokenizer)  # 带 stop 字符串的请求逐个 token 过它
        self._outputs: Dict[int, List[int]] = {}
        self._done: Dict[int, str] = {}
        self._cached: Dict[int, int] = {}
        self._logprobs: Dict[int, List[float]] = {}
        self._top: Dict[int, List[List[Tuple[int, float]]]] = {}
        self._texts: Dict[int, List[str]] = {}  # 带 stop 字符串的请求：detokenizer 一段段给出的文字
        self._hit: List[int] = []  # 命中了 stop 字符串、调度器还在生成的请求：在两步之间中止
        self._next_uid = 0
        self._lock = threading.Lock()  # generate 一次跑一批：几个线程同时调用时轮流来

    def __enter__(self) -> "LLM":  # with LLM(...) as llm: 离开时 shutdown
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def send_result(self, replies: List[DetokenizeMsg]) -> None:
        for r in replies:
            finished, reason = r.finished, r.finish_reason
            if r.uid in self._texts:  # 带 stop 字符串：每个 token 先过 detokenizer，和服务里一样
                reply = self.detokenize_manager.detokenize(r)
                if reply is None:  # 命中之后路上的 token、中止的那条消息：都不要
                    continue
                self._texts[r.uid].append(reply.incremental_output)
                if reply.finished and not r.finished:  # 命中了：这个 token 还算，请求在这一步之后中止
                    self._hit.append(r.uid)
                finished, reason = reply.finished, reply.finish_reason
            if r.next_token >= 0:
                self._outputs[r.uid].append(r.next_token)
            if r.cached_tokens:
                self._cached[r.uid] = r.cached_tokens
            if r.logprob is not None:
                self._logprobs.setdefault(r.uid, []).append(r.logprob)
            if r.top_ids is not None:
                self._top.setdefault(r.uid, []).append(list(zip(r.top_ids, r.top_logprobs)))
            if finished:
                self._done[r.uid] = reason or "stop"

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, *, n: int = 1,
                 stop: str | Sequence[str] | None = None) -> List[Dict[str, Any]]:
        """prompts：一个或一组（字符串或 token id 列表）；sampling_params：一个（所有请求共用）或每个请求一个。
        n：每个提示词几个回答（给了 seed 时第 j 个用 seed + j），结果按提示词排，同一个提示词的 n 个挨着；
        stop：stop 字符串（一个或一组，这次的请求共用），文字截在最先出现的那个前面，finish_reason 是 "stop"。

        返回每个请求一个 {"text", "token_ids", "finish_reason", "cached_tokens"}，顺序与 prompts 相同；
        cached_tokens 是提示词里命中前缀缓存、没有重新 prefill 的 token 数。要了 logprobs 的请求还有 "logprobs"
        （每个 token 的对数概率），top_logprobs > 0 时还有 "top_logprobs"（每个 token 一个 [(id, logprob), ...]）。
        """
        if not isinstance(prompts, (str, list, tuple)):  # 张量、数组、生成器：先 .tolist() / list(...)
            raise TypeError(f"prompts must be a string, a list of token ids, or a list of those; "
                            f"got {type(prompts).__name__}")
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        params = sampling_params if isinstance(sampling_params, (list, tuple)) else \
            [sampling_params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling_params")
        if not all(isinstance(sp, SamplingParams) for sp in params):
            raise TypeError("sampling_params must be SamplingParams (one, or one per prompt)")
        if not (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
            raise ValueError(f"n={n!r} must be an integer >= 1 (answers per prompt)")
        stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
        if not (isinstance(stops, (list, tuple)) and all(isinstance(s, str) for s in stops)):
            raise TypeError(f"stop must be a string or a list of strings; got {stop!r:.60}")
        encoded = [self._prompt_ids(p, sp) for p, sp in zip(prompts, params)]  # 先全部检查：有一个不合格，就一个也不交
        with self._lock:
            return self._run(encoded, params, n, stops, use_tqdm)

    def _run(self, encoded: List[List[int]], params: Sequence[SamplingParams], n: int, stops: Sequence[str],
             use_tqdm: bool) -> List[Dict[str, Any]]:
        """generate 检查过的请求：交给调度器，一步一步跑到这些请求全部结束，按顺序收结果。"""
        requests = [(ids, nth_sample(sp, j)) for ids, sp in zip(encoded, params) for j in range(n)]
        uids = list(range(self._next_uid, self._next_uid + len(requests)))
        self._next_uid += len(requests)
        for uid, (ids, sp) in zip(uids, requests):
            self._outputs[uid] = []
            if stops:
                self._texts[uid] = []
                self.detokenize_manager.add_request(uid, len(ids), stops)
            self.receive_msg(UserMsg(uid, torch.tensor(ids, dtype=torch.int32), sp))
        bar = tqdm(total=len(uids), desc="generate", disable=not use_tqdm)
        with torch.inference_mode(), sigint_between_steps() as interrupted:
            try:
                while any(u not in self._done for u in uids) and not interrupted[0]:
                    before = len(self._done)
                    # 没有事可做了还有请求没结束：不应发生（防止死循环）。先再看一眼：这一步里刚被拒绝的请求（附录：
                    # 语法编译失败）已经结束了，这一步却返回"没事可做"
                    if not self.run_step() and any(u not in self._done for u in uids):
                        raise RuntimeError("the scheduler stopped with requests unfinished")
                    for uid in self._hit:  # 命中 stop 字符串：让调度器停下，槽和页回来
                        self.abort_request(uid)
                    self._hit.clear()
                    bar.update(len(self._done) - before)
                if interrupted[0]:  # 还没结束的都中止（已经结束的什么也不做）：槽和页在下面的几步里回来
                    for uid in uids:
                        self.abort_request(uid)
                while self.run_step():  # 重叠时最后一步的结果还在飞行中：把它处理完，资源才会释放
                    pass
            except BaseException:  # 一步算到半路抛了异常（显存不够、bug）：这次的请求全部中止、资源收回，再原样抛出
                self.forget_in_flight()
                self._hit.clear()
                for uid in uids:
                    self.abort_request(uid)
                self._drop(uids)
                raise
            finally:
                bar.close()
        if interrupted[0]:
            self._drop(uids)
            raise KeyboardInterrupt
        results = []
        for uid in uids:
            ids, finish, pieces = self._outputs.pop(uid), self._done.pop(uid), self._texts.pop(uid, None)
            # 和 detokenizer 一样解码：以 "stop" 结束（EOS、stop_token_ids）时最后一个 token 不显示
            text = "".join(pieces) if pieces is not None else \
                self.detokenize_manager.decode(ids[:-1] if finish == "stop" else ids)
            out = {"text": text, "token_ids": ids, "finish_reason": finish, "cached_tokens": self._cached.pop(uid, 0)}
            if uid in self._logprobs:
                out["logprobs"] = self._logprobs.pop(uid)
            if uid in self._top:
                out["top_logprobs"] = self._top.pop(uid)
            results.append(out)
        return results

    def chat(self, conversations: Conversation | Sequence[Conversation],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, use_tqdm: bool = True, *,
             n: int = 1, stop: str | Sequence[str] | None = None,
             chat_template_kwargs: Dict[str, Any] | None = None) -> List[Dict[str, Any]]:
        """conversations：一段对话（消息的列表）或一组对话。套上模型的对话模板（TokenizeManager，和服务的
        /v1/chat/completions 一样；chat_template_kwargs 原样交给模板，比如 Qwen3 的 enable_thinking），再 generate。"""
        if isinstance(conversations, (list, tuple)) and conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # 一段对话
        if not isinstance(conversations, (list, tuple)) or not all(
                isinstance(c, (list, tuple)) and c and all(isinstance(m, dict) for m in c) for c in conversations):
            raise TypeError("conversations must be a list of messages ({'role': ..., 'content': ...}), "
                            "or a list of such lists")
        for m in (m for c in conversations for m in c):  # 模板拿到别的东西时是 jinja2 的错，说不清是哪条消息
            if not (isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise TypeError(f"a message needs a string 'role' and a string 'content' (join text parts "
                                f"yourself); got {m!r:.80}")
        if not isinstance(chat_template_kwargs, (dict, type(None))):
            raise TypeError(f"chat_template_kwargs must be a dict; got {chat_template_kwargs!r:.60}")
        prompts = [self.tokenize_manager.encode(list(c), chat_template_kwargs) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm, n=n, stop=stop)

    def _drop(self, uids: List[int]) -> None:
        """这次调用的结果不要了（Ctrl-C、出错）：收结果的几个字典里不留它们。"""
        for uid in uids:
            for outputs in (self._outputs, self._done, self._cached, self._logprobs, self._top, self._texts):
                outputs.pop(uid, None)

    def _prompt_ids(self, prompt: Prompt, sp: SamplingParams) -> List[int]:
        """用户能改的东西在接口处检查，抛 ValueError 并说该调哪个参数，而不是让引擎在半路出错。"""
        if not (isinstance(prompt, str) or (isinstance(prompt, (list, tuple)) and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt))):
            raise TypeError(f"a prompt must be a string or a list of token ids (ints); got {prompt!r:.60}")
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("a prompt is empty: give at least one token")
        if len(ids) >= self.engine.max_seq_len:
            raise ValueError(f"a prompt has {len(ids)} tokens; max_seq_len is {self.engine.max_seq_len} "
                             "(--max-seq-len-override)")
        V = self.engine.model_config.vocab_size
        if min(ids) < 0 or max(ids) >= V:
            raise ValueError(f"a prompt has token ids outside the vocabulary 0..{V - 1}")
        bias_ids, _ = sp.logit_bias_ids
        if bias_ids and max(bias_ids) >= V:  # 键是十进制数字串，不会是负数
            raise ValueError(f"logit_bias has token ids outside the vocabulary 0..{V - 1}")
        if sp.stop_token_ids and max(sp.stop_token_ids) >= V:
            raise ValueError(f"stop_token_ids has token ids outside the vocabulary 0..{V - 1}")
        return ids
