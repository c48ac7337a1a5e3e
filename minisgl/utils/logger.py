# Tangled from book/chapters/ch01_skeleton.ipynb — edit the notebook, not this file.
from __future__ import annotations

import logging
import sys
import time


_LOG_RANK = (0, 1)  # (rank, size)：set_tp_info 通过 set_log_rank 告诉日志；没设置时当作单进程


def set_log_rank(rank: int, size: int) -> None:
    """记下本进程的 TP 位置：*_rank0 方法据此决定打不打印，size > 1 时每行带上 TP{rank}。"""
    global _LOG_RANK
    _LOG_RANK = (rank, size)


class MiniLogger(logging.Logger):
    """标准 Logger，加上只在 rank 0 打印的 info_rank0（引擎启动时的那几行，TP 下不必每个 rank 都说一遍）。"""

    def info_rank0(self, msg: object, *args: object) -> None:
        if _is_rank0():
            self.info(msg, *args, stacklevel=2)


def _is_rank0() -> bool:
    return _LOG_RANK[0] == 0


_COLORS = {"DEBUG": "\033[36m", "INFO": "\033[32m", "WARNING": "\033[33m", "ERROR": "\033[31m"}


class _Formatter(logging.Formatter):
    def __init__(self, color: bool) -> None:
        super().__init__()
        self.color = color

    def format(self, record: logging.LogRecord) -> str:
        rank, size = _LOG_RANK
        where = f" TP{rank}" if size > 1 else ""
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        level = record.levelname
        if self.color:
            level = f"{_COLORS.get(level, '')}{level}\033[0m"
        return f"[{stamp}{where}] {level} {record.name}: {record.getMessage()}"


class _StdoutHandler(logging.StreamHandler):
    """每次写日志时才取 sys.stdout：Jupyter 和 pytest 都会替换它。"""

    @property  # type: ignore[override]  # 基类把 stream 当普通属性
    def stream(self):  # noqa: D401
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:
        pass


def init_logger(name: str) -> MiniLogger:
    """每个模块一个：logger = init_logger(__name__)。"""
    from minisgl.env import load_env

    old = logging.getLoggerClass()
    logging.setLoggerClass(MiniLogger)
    try:
        logger = logging.getLogger(name)
    finally:
        logging.setLoggerClass(old)
    assert isinstance(logger, MiniLogger), f"logger {name!r} was created elsewhere as {type(logger)}"
    root = logging.getLogger(name.split(".")[0])
    if not root.handlers:  # 每个顶层包只装一个 handler
        handler = _StdoutHandler()
        handler.setFormatter(_Formatter(color=sys.stdout.isatty()))
        root.addHandler(handler)
        root.propagate = False
        root.setLevel(load_env().log_level.upper())
    return logger
