"""第 1 章练习：带类型的环境变量（参考答案）。"""
from __future__ import annotations

import re
from fractions import Fraction
from typing import Mapping

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}

_SIZE_RE = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([KMGT]?)(I?B)?", re.IGNORECASE)


def parse_bool(raw: str) -> bool:
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"{raw!r} is not a bool (use 1/true/yes/on or 0/false/no/off)")


def parse_size(raw: str) -> int:
    m = _SIZE_RE.fullmatch(raw.strip())
    if m is None:
        raise ValueError(f"{raw!r} is not a size (examples: 4096, 64K, 512M, 1.5G, 2GiB)")
    number, unit, suffix = m.groups()
    if suffix is not None and suffix.upper() == "IB" and unit == "":
        raise ValueError(f"{raw!r} is not a size ('iB' needs a unit: KiB, MiB, ...)")
    # Fraction 是精确的：大整数和 1.5G 都不会有浮点误差
    return int(Fraction(number) * SIZE_UNITS[unit.upper()])


_PARSERS = {"bool": parse_bool, "int": int, "float": float, "size": parse_size}


def read_env(environ: Mapping[str, str], name: str, kind: str, default):
    if kind not in _PARSERS:
        raise ValueError(f"unknown kind {kind!r} for {name}; use one of {sorted(_PARSERS)}")
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return _PARSERS[kind](raw.strip())
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a valid {kind}") from None
