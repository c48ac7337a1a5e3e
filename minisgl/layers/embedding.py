# Tangled from book/chapters/ch05_tensor_parallel.ipynb and ch08_engine.ipynb — edit the notebooks, not this file.
from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.distributed import all_gather, all_reduce, get_tp_info, vocab_range
from minisgl.utils import div_ceil

from .base import BaseOP, linear, onednn_weight


class VocabParallelEmbedding(BaseOP):
    """词嵌入表按词表切：本 rank 存 ceil(V/tp) 行（不满的用 0 补齐），查自己那段 id，其余置 0，再 all-reduce。"""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        tp = get_tp_info()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self._tp_size = tp.size
        self._vocab_start, self._vocab_end = vocab_range(num_embeddings, tp)
        self.weight = torch.empty(div_ceil(num_embeddings, tp.size), embedding_dim)  # [V/tp 上取整, E]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self._tp_size == 1:
            return F.embedding(input_ids, self.weight)  # [T] -> [T, E]
        mine = (input_ids >= self._vocab_start) & (input_ids < self._vocab_end)  # [T] bool
        local = torch.where(mine, input_ids - self._vocab_start, 0)  # [T]：越界的先查第 0 行
        y = F.embedding(local, self.weight).masked_fill_(~mine.unsqueeze(-1), 0.0)  # [T, E]
        return all_reduce(y)  # 每个 id 恰好一个 rank 非 0


class ParallelLMHead(BaseOP):
    """输出头：logits = x @ weight.T。按词表切：本 rank 算自己那段 logits，all-gather 拼成 [T, V]。

    绑定词嵌入时不持有自己的权重（也就不出现在 state_dict 里），用词嵌入那份同样切好的表。
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, tie_word_embeddings: bool = False,
                 tied_embedding: VocabParallelEmbedding | None = None) -> None:
        if tie_word_embeddings != (tied_embedding is not None):
            raise ValueError(f"tie_word_embeddings={tie_word_embeddings} needs tied_embedding to be "
                             f"{'the model embedding' if tie_word_embeddings else 'None'}")
        self.num_embeddings = num_embeddings
        self._tied = tied_embedding  # 下划线：只是引用，参数属于词嵌入
        self._tp_size = get_tp_info().size
        self._onednn: torch.Tensor | None = None  # CPU：use_onednn 排好的一份
        if tied_embedding is None:
            self.weight = torch.empty(div_ceil(num_embeddings, self._tp_size), embedding_dim)  # [V/tp, E]

    def use_onednn(self) -> None:
        """CPU、float32：排好一份。绑定词嵌入时词嵌入照旧用原来那份查表，所以多占一份 [V/tp, E]。"""
        self._onednn = onednn_weight(self._tied.weight if self._tied is not None else self.weight)
        if self._tied is None:
            self.weight = self._onednn  # 不绑定时原来那份没有别人用

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._onednn is not None:
            logits = linear(x, self._onednn)  # [T, E] -> [T, V/tp]
        else:  # GPU 上它本来就读满带宽，不走 GEMV（见上面"批大小 1 的矩阵乘"）
            logits = F.linear(x, self._tied.weight if self._tied is not None else self.weight)
        if self._tp_size == 1:
            return logits
        return all_gather(logits)[:, :self.num_embeddings]  # [T, tp·V/tp] -> [T, V]，去掉补齐的列
