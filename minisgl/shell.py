# Tangled from book/chapters/ch15_server.ipynb — edit the notebook, not this file.
"""python -m minisgl.shell（或 python -m minisgl --shell）：在终端里和模型对话。"""
from __future__ import annotations

import sys
from typing import Dict, List

from minisgl.core import SamplingParams
from minisgl.message import TokenizeMsg
from minisgl.server.api_server import FrontendManager

SHELL_SAMPLING = SamplingParams(temperature=0.6, max_tokens=512)  # upstream 的 shell 也用温度 0.6
HELP = "输入消息回车发送；/reset 清空对话，/exit 退出（Ctrl-D 也行）"

async def run_shell(state: FrontendManager, sampling: SamplingParams = SHELL_SAMPLING) -> None:
    """一问一答：整段对话历史每轮都发给模型（套对话模板），回答流式地写到终端。"""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import InMemoryHistory

    session: PromptSession[str] = PromptSession(history=InMemoryHistory())  # 上下键翻出之前的输入
    history: List[Dict[str, str]] = []
    sys.stdout.write(HELP + "\n")
    while True:
        try:
            line = (await session.prompt_async("> ")).strip()
        except (EOFError, KeyboardInterrupt):
            break
        if line == "/exit":
            break
        if line == "/reset":
            history.clear()
            sys.stdout.write("(history cleared)\n")
            continue
        if not line:
            continue
        history.append({"role": "user", "content": line})
        uid = state.new_users()[0]
        await state.send_one(TokenizeMsg(uid=uid, text=list(history), sampling_params=sampling))
        answer = ""
        async for ack in state.wait_for_ack(uid):
            answer += ack.incremental_output
            sys.stdout.write(ack.incremental_output)
            sys.stdout.flush()
        sys.stdout.write("\n")
        history.append({"role": "assistant", "content": answer})

if __name__ == "__main__":
    from minisgl.server.launch import launch_server

    sys.exit(launch_server(sys.argv[1:], run_shell=True))
