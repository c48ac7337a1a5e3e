# Tangled from book/chapters/ch01_skeleton.ipynb — edit the notebook, not this file.
"""minisgl：一个可以一章一章手写出来的 LLM 推理引擎。"""

__version__ = "0.1.0"
