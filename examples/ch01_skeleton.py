# Tangled from book/chapters/ch01_skeleton.ipynb — edit the notebook, not this file.
"""第 1 章：环境变量、日志、注册表，以及离线可用的两样东西——内置模型和 Qwen3 分词器。"""

import json

from minisgl.env import Env, load_env
from minisgl.utils import Registry, div_ceil, init_logger
from minisgl.utils.hf import default_model_path, load_tokenizer, qwen3_tokenizer_dir

logger = init_logger("ch01")

print("环境变量：")
for name, typ, value, doc in load_env().describe():
    print(f"  {name:<20} {typ:<5} {value:<20} {doc}")
try:
    Env.from_environ({"MINISGL_LOG_LEVLE": "DEBUG"})
except ValueError as e:
    print("拼错的变量名：", e)

BACKENDS: Registry[str] = Registry("attention backend")
BACKENDS.register("torch")("pure PyTorch, CPU and GPU")
BACKENDS.register("fi")("FlashInfer, GPU")
try:
    BACKENDS.get("flash")
except ValueError as e:
    print("查不到的后端：", e)
logger.info_rank0("一条只在 rank 0 打印的日志；放 1000 个 token 需要 %d 个 16-token 页", div_ceil(1000, 16))

path = default_model_path()
cfg = json.load(open(path / "config.json"))
size = sum(f.stat().st_size for f in path.glob("*.safetensors")) / 2**20
print(f"内置模型 {path.name}: {cfg['architectures'][0]}, {cfg['num_hidden_layers']} 层, "
      f"hidden={cfg['hidden_size']}, 词表 {cfg['vocab_size']}, 权重 {size:.0f} MiB")

tok = load_tokenizer(qwen3_tokenizer_dir())
text = tok.apply_chat_template([{"role": "user", "content": "用一句话介绍北京。"}], tokenize=False,
                               add_generation_prompt=True)
ids = tok.encode(text)
print(f"Qwen3 分词器：词表 {len(tok)}，对话模板展开后 {len(ids)} 个 token")
print(repr(text))
print("前 8 个 token：", [tok.decode([i]) for i in ids[:8]])
