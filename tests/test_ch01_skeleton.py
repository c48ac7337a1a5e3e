# Tangled from book/chapters/ch01_skeleton.ipynb — edit the notebook, not this file.
import pytest
import torch

from minisgl.distributed import DistributedInfo, get_tp_info, set_tp_info, try_get_tp_info
from minisgl.env import Env
from minisgl.utils import (Registry, align_down, align_ceil, cpu_cores, div_ceil, init_logger, parse_dtype,
                           pick_device, set_num_threads, torch_dtype)
from minisgl.utils.hf import default_model_path, load_tokenizer, qwen3_tokenizer_dir, resolve_model_path


def test_env_parses_types_and_rejects_bad_values():
    env = Env.from_environ({"MINISGL_LOG_LEVEL": "debug", "MINISGL_CACHE_DIR": "/tmp/x"})
    assert (env.log_level, env.cache_dir) == ("debug", "/tmp/x")
    assert Env.from_environ({}) == Env()
    with pytest.raises(ValueError, match="MINISGL_LOG_LEVLE"):
        Env.from_environ({"MINISGL_LOG_LEVLE": "DEBUG"})
    with pytest.raises(ValueError, match=r"MINISGL_LOG_LEVEL='verbose' is not a log level; choose one of"):
        Env.from_environ({"MINISGL_LOG_LEVEL": "verbose"})


def test_env_value_parser():
    from minisgl.env import _parse

    assert [_parse("X", v, "bool") for v in ("1", "true", "ON", "no", "0")] == [True, True, True, False, False]
    assert _parse("X", "512M", "int") == 512 << 20 and _parse("X", "7", "int") == 7
    assert _parse("X", "auto", "bool | None") is None and _parse("X", "yes", "bool | None") is True
    with pytest.raises(ValueError, match=r"MINISGL_X='maybe' is not a valid bool"):
        _parse("MINISGL_X", "maybe", "bool")
    with pytest.raises(ValueError, match="MINISGL_N='12x'"):
        _parse("MINISGL_N", "12x", "int")


def test_registry():
    reg: Registry[int] = Registry("thing")
    f = reg.register("b")(lambda: 2)
    assert f() == 2 and reg.get("b") is f  # 装饰器原样返回
    reg.register("a")(lambda: 1)
    assert reg.names() == ["a", "b"] and "a" in reg and "c" not in reg
    with pytest.raises(ValueError, match=r"thing 'a' is already registered"):
        reg.register("a")(lambda: 3)
    with pytest.raises(ValueError, match=r"unknown thing 'c'; choose one of \['a', 'b'\]"):
        reg.get("c")


def test_misc_and_torch_utils():
    assert [div_ceil(n, 16) for n in (0, 1, 16, 17)] == [0, 1, 1, 2]
    assert (align_down(17, 8), align_ceil(17, 8), align_ceil(16, 8)) == (16, 24, 16)
    with torch_dtype(torch.bfloat16):
        assert torch.empty(1).dtype == torch.bfloat16
    assert torch.empty(1).dtype == torch.float32
    with pytest.raises(ValueError, match="choose one of"):
        parse_dtype("fp8")
    assert pick_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="--device 'bogus' is invalid"):
        pick_device("bogus")
    old = torch.get_num_threads()
    try:
        assert set_num_threads(1) == 1 == torch.get_num_threads()
        assert set_num_threads(None, share=cpu_cores() + 1) == 1  # 核不够分：至少一个线程
        with pytest.raises(ValueError, match="num_threads=0"):
            set_num_threads(0)
    finally:
        torch.set_num_threads(old)


def test_tp_info_must_be_set(monkeypatch):
    from minisgl.distributed import info
    from minisgl.utils import logger as logger_module

    monkeypatch.setattr(info, "_TP_INFO", None)  # 这个测试进程里谁都没设置过
    monkeypatch.setattr(logger_module, "_LOG_RANK", logger_module._LOG_RANK)  # 测试结束时恢复
    assert try_get_tp_info() is None
    with pytest.raises(RuntimeError, match=r"call set_tp_info\(rank, size\)"):
        get_tp_info()
    assert set_tp_info(0, 1) == get_tp_info() == DistributedInfo(0, 1)
    assert set_tp_info(0, 1) == DistributedInfo(0, 1)  # 同一个值可以再设
    with pytest.raises(RuntimeError, match="cannot change it"):
        set_tp_info(1, 2)
    with pytest.raises(ValueError):
        DistributedInfo(2, 2)


def test_rank0_logging(monkeypatch, capsys):
    from minisgl.distributed import info
    from minisgl.utils import logger as logger_module

    logger = init_logger("minisgl.test_ch01")
    monkeypatch.setattr(logger_module, "_LOG_RANK", logger_module._LOG_RANK)  # 测试结束时恢复
    monkeypatch.setattr(info, "_TP_INFO", None)
    set_tp_info(0, 1)
    logger.info_rank0("from rank zero")
    monkeypatch.setattr(info, "_TP_INFO", None)
    set_tp_info(1, 2)  # 装作第二个进程：set_tp_info 把 rank 告诉日志
    logger.info_rank0("from rank one")
    logger.info("every rank")
    out = capsys.readouterr().out
    assert "from rank zero" in out and "from rank one" not in out and "TP1] INFO minisgl.test_ch01: every rank" in out


def test_qwen3_tokenizer_is_real():
    tok = load_tokenizer(qwen3_tokenizer_dir())
    ids = tok.encode("你好，世界")
    assert tok.decode(ids) == "你好，世界" and len(tok) > 150000
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>user\nhi<|im_end|>") and text.endswith("<|im_start|>assistant\n")


def test_default_model_folder(smollm2):
    assert smollm2 == default_model_path() == resolve_model_path(None)
    cfg = __import__("json").loads((smollm2 / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_hidden_layers"] == 30
    assert (smollm2 / "model.safetensors").stat().st_size > 200 << 20
    assert "quantization_config" not in cfg  # 已经是普通的浮点权重


def test_resolve_model_path_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        resolve_model_path(str(tmp_path))
    for missing in ("no-such-model", "/no-such-folder", "./no-such-folder", "~/no-such-folder"):
        with pytest.raises(FileNotFoundError, match="not a model folder"):
            resolve_model_path(missing)


def test_tiny_models_load_in_transformers(tiny_qwen3, tiny_llama):
    from transformers import AutoModelForCausalLM

    for path in (tiny_qwen3, tiny_llama):
        model = AutoModelForCausalLM.from_pretrained(path)
        logits = model(torch.tensor([[1, 2, 3]])).logits
        assert logits.shape == (1, 3, 151936) and logits.std() > 1.0  # initializer_range=0.5：logits 不平
