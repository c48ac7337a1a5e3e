# Tangled from book/chapters/ch09_continuous_batching.ipynb — edit the notebook, not this file.
from .llm import LLM

__all__ = ["LLM"]
