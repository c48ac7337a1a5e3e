# Tangled from book/chapters/ch13_tokenizer.ipynb — edit the notebook, not this file.
from .detokenize import DecodeState, DetokenizeManager, token_bytes
from .server import TokenizerLoop, tokenize_worker
from .tokenize import TokenizeManager, nth_sample

__all__ = ["DecodeState", "DetokenizeManager", "TokenizeManager", "TokenizerLoop", "nth_sample", "token_bytes",
           "tokenize_worker"]
