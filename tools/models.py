#!/usr/bin/env python3
"""Models offline (BOOK.md §6).

    python tools/models.py smollm2            build (once) and print the embedded SmolLM2-135M-Instruct folder
    python tools/models.py tiny KIND DIR      write a tiny random model (qwen3 | llama | qwen3_moe) into DIR
    python tools/models.py qwen3-tokenizer    print the folder of the real Qwen3 tokenizer

The code lives where the book writes it: the SmolLM2 conversion in minisgl/utils/hf.py (chapter 1) and the
tiny-model maker in tests/conftest.py (chapter 1). For models from the hub, see tools/download_model.py.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str]) -> int:
    if argv[:1] == ["smollm2"]:
        from minisgl.utils.hf import default_model_path

        print(default_model_path())
        return 0
    if argv[:1] == ["qwen3-tokenizer"]:
        from minisgl.utils.hf import qwen3_tokenizer_dir

        print(qwen3_tokenizer_dir())
        return 0
    if argv[:1] == ["tiny"] and len(argv) == 3:
        sys.path.insert(0, str(ROOT / "tests"))
        from conftest import make_tiny_model

        path = Path(argv[2])
        path.mkdir(parents=True, exist_ok=True)
        print(make_tiny_model(argv[1], path))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
