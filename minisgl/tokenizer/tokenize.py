# Tangled from book/chapters/ch13_tokenizer.ipynb — edit the notebook, not this file.
from __future__ import annotations

from typing import Any, Dict, List

import torch

from minisgl.message import TokenizeMsg, UserMsg


class TokenizeManager:
    """文字 → token：提示词直接分词；对话消息先套模型的对话模板。"""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def render(self, text: str | List[Dict[str, str]], chat_options: Dict[str, Any] | None = None) -> str:
        if isinstance(text, str):
            return text
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"{type(self.tokenizer).__name__} has no chat template: send a prompt string, "
                             f"not {len(text)} chat messages")
        prompt = self.tokenizer.apply_chat_template(text, tokenize=False, add_generation_prompt=True,
                                                    **(chat_options or {}))
        assert isinstance(prompt, str), type(prompt)
        return prompt

    def encode(self, text: str | List[Dict[str, str]],
               chat_options: Dict[str, Any] | None = None) -> List[int]:
        # 模板渲染出来的文字里已经有 BOS 之类的特殊 token，不能再加一遍；纯提示词按分词器的默认规则加
        prompt = self.render(text, chat_options)
        return self.tokenizer.encode(prompt, add_special_tokens=isinstance(text, str))

    def tokenize(self, msg: TokenizeMsg) -> UserMsg:
        ids = self.encode(msg.text, msg.chat_options)
        if not ids:
            raise ValueError(f"request {msg.uid}: the prompt is empty after tokenization")
        input_ids = torch.tensor(ids, dtype=torch.int32)  # [L]，CPU
        return UserMsg(uid=msg.uid, input_ids=input_ids, sampling_params=msg.sampling_params)
