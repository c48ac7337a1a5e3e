# Tangled from book/chapters/ch01_skeleton.ipynb and ch08_engine.ipynb — edit the notebooks, not this file.
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Mapping, Tuple


PREFIX = "MINISGL_"


def _var(name: str, default: Any, doc: str) -> Any:
    return field(default=default, metadata={"env": PREFIX + name, "doc": doc})


@dataclass(frozen=True)
class Env:
    """本项目读取的全部 MINISGL_* 环境变量：类型、默认值和含义都在这里，启动时解析一次。"""

    log_level: str = _var("LOG_LEVEL", "INFO", "日志级别：DEBUG / INFO / WARNING / ERROR")
    cache_dir: str = _var("CACHE_DIR", "~/.cache/minisgl", "内置模型等缓存文件放在哪里")
    fused_kernels: bool = _var("FUSED_KERNELS", True, "GPU 上 bf16/fp16 时用融合 kernel（FlashInfer 的 norm、"
                               "RoPE、激活，Triton 的 q/k norm + RoPE + 写 KV 和小批量矩阵乘）；0 关掉（对比用）")

    def __post_init__(self) -> None:
        levels = ("DEBUG", "INFO", "WARNING", "ERROR")
        if self.log_level.upper() not in levels:
            raise ValueError(f"{PREFIX}LOG_LEVEL={self.log_level!r} is not a log level; choose one of {levels}")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Env:
        environ = os.environ if environ is None else environ
        known = {f.metadata["env"]: f for f in fields(cls)}
        unknown = sorted(k for k in environ if k.startswith(PREFIX) and k not in known)
        if unknown:  # 拼错的变量名不能被悄悄忽略
            raise ValueError(f"unknown environment variable(s) {unknown}; known: {sorted(known)}")
        values: Dict[str, Any] = {}
        for name, f in known.items():
            if name in environ:
                values[f.name] = _parse(name, environ[name], str(f.type))
        return cls(**values)

    def describe(self) -> List[Tuple[str, str, str, str]]:
        """(变量名, 类型, 当前值, 说明)，给文档和 --help 用。"""
        return [(f.metadata["env"], str(f.type), repr(getattr(self, f.name)), f.metadata["doc"])
                for f in fields(self)]


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_SIZES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _parse(name: str, raw: str, typ: str) -> Any:
    text = raw.strip()
    if typ.endswith("| None"):
        if text.lower() in ("", "none", "auto"):
            return None
        typ = typ[: -len("| None")].strip()
    try:
        if typ == "bool":
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise ValueError(f"expected one of {_TRUE + _FALSE}")
        if typ == "int":
            if text[-1:].upper() in _SIZES:  # 允许 512M、1G 这样的大小
                return int(float(text[:-1]) * _SIZES[text[-1].upper()])
            return int(text)
        if typ == "float":
            return float(text)
        if typ == "str":
            return text
    except ValueError as e:
        raise ValueError(f"{name}={raw!r} is not a valid {typ}: {e}") from e
    raise AssertionError(f"Env field {name} has unsupported type {typ!r}")


def load_env() -> Env:
    """读取当前进程的环境变量。代价很小，需要时调用即可，不要缓存成全局变量。"""
    return Env.from_environ()
