# Tangled from book/chapters/ch09_continuous_batching.ipynb — edit the notebook, not this file.
from .backend import AbortBackendMsg, BaseBackendMsg, BatchBackendMsg, ExitMsg, UserMsg
from .tokenizer import BaseTokenizerMsg, DetokenizeMsg

__all__ = ["AbortBackendMsg", "BaseBackendMsg", "BaseTokenizerMsg", "BatchBackendMsg", "DetokenizeMsg", "ExitMsg",
           "UserMsg"]
