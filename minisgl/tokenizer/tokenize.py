# Tangled from book/chapters/ch13_tokenizer.ipynb — edit the notebook, not this file.
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List

import torch

from minisgl.core import SamplingParams
from minisgl.message import TokenizeMsg, UserMsg


class TokenizeManager:
    """文字 → token：提示词直接分词；对话消息先套模型的对话模板；token id 原样用。

    max_seq_len：服务的上下文长度（第 15 章的启动器给出）。给了就在这里拒绝放不下的请求，说清楚差多少。
    """

    def __init__(self, tokenizer: Any, max_seq_len: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len

    def render(self, text: str | List[Dict[str, str]], chat_options: Dict[str, Any] | None = None) -> str:
        if isinstance(text, str):
            return text
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"{type(self.tokenizer).__name__} has no chat template: send a prompt string, "
                             f"not {len(text)} chat messages")
        options = chat_options or {}
        # continue_final_message（附录的对话接口）：接着最后一条 assistant 消息往下写，不另起一条，也就没有生成提示
        prompt = self.tokenizer.apply_chat_template(text, tokenize=False,
                                                    add_generation_prompt=not options.get("continue_final_message"),
                                                    **options)
        assert isinstance(prompt, str), type(prompt)
        return prompt

    def encode(self, text: str | List[Dict[str, str]] | List[int],
               chat_options: Dict[str, Any] | None = None) -> List[int]:
        if isinstance(text, list) and all(isinstance(t, int) for t in text):
            return list(text)  # 客户端已经分好词了（/v1/completions 的 token id 提示词）
        # 模板渲染出来的文字里已经有 BOS 之类的特殊 token，不能再加一遍；纯提示词按分词器的默认规则加
        prompt = self.render(text, chat_options)  # type: ignore[arg-type]
        return self.tokenizer.encode(prompt, add_special_tokens=isinstance(text, str))

    def tokenize(self, msg: TokenizeMsg) -> UserMsg:
        ids = self.encode(msg.text, msg.chat_options)
        if not ids:
            raise ValueError("the prompt is empty after tokenization")  # 回给这个请求的客户端：不提内部的 uid
        n, limit, max_tokens = len(ids), self.max_seq_len, msg.sampling_params.max_tokens
        if limit is not None and n >= limit:
            raise ValueError(f"the prompt has {n} tokens; this server's context is {limit} tokens "
                             f"(prompt and output together), so a prompt may have at most {limit - 1}")
        if limit is not None and max_tokens is not None and max_tokens > limit - n:
            raise ValueError(f"max_tokens={max_tokens} is too large: the prompt has {n} tokens and the context "
                             f"is {limit}, so at most {limit - n} tokens can be generated")
        input_ids = torch.tensor(ids, dtype=torch.int32)  # [L]，CPU
        return UserMsg(uid=msg.uid, input_ids=input_ids, sampling_params=msg.sampling_params)


def nth_sample(sp: SamplingParams, j: int) -> SamplingParams:
    """同一个提示词的 n 个回答里第 j 个（从 0 数）的采样参数：给了 seed 时用 seed + j（在 64 位有符号整数里回绕）。
    于是 n 个回答各不相同，第 j 个又和单独发一个 seed + j 的请求一样；没给 seed 或 j = 0 时原样返回。"""
    if sp.seed is None or j == 0:
        return sp
    return replace(sp, seed=(sp.seed + j + 2**63) % 2**64 - 2**63)
