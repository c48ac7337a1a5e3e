# Tangled from book/chapters/ch15_server.ipynb — edit the notebook, not this file.
"""python -m minisgl.shell（或 python -m minisgl --shell）：在终端里和模型对话。"""
from __future__ import annotations

import asyncio
import signal
import sys
from typing import Dict, List

from minisgl.core import SamplingParams
from minisgl.message import TokenizeMsg
from minisgl.server.api_server import APIError, FrontendManager

SHELL_SAMPLING = SamplingParams(temperature=0.6)  # upstream 的 shell 也用温度 0.6；回答到结束符，最多到上下文满
HELP = "输入消息回车发送；回答时 Ctrl-C 停下这个回答；/reset 清空对话，/exit 退出（Ctrl-D 也行），/help 显示这一行"

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
        if line.startswith("/"):  # /help 和打错的命令：不当成消息发给模型
            sys.stdout.write(HELP + "\n" if line == "/help" else f"unknown command {line}; {HELP}\n")
            continue
        if not line:
            continue
        history.append({"role": "user", "content": line})
        answer = await stream_answer(state, history, sampling)
        if answer is None:  # 被 Ctrl-C 停下，或者被拒绝（对话长过了上下文）：这一问不进历史
            history.pop()
            continue
        history.append({"role": "assistant", "content": answer})

async def stream_answer(state: FrontendManager, history: List[Dict[str, str]], sampling: SamplingParams) -> str | None:
    """把回答边生成边写到终端，返回它；写到一半按了 Ctrl-C：中止这个请求（槽和页回到调度器），返回 None；
    请求被拒绝（对话历史长过了上下文）：说出原因，返回 None。

    输入时终端归 prompt_toolkit 管，Ctrl-C 只是一个按键；回答时它是发给整个进程组的 SIGINT：这段时间里由事件循环
    接住，只取消写回答的任务（工作进程不理会它，见 launch.py 的 _ignoring_sigint）。"""
    uid = state.new_users()[0]
    await state.send_one(TokenizeMsg(uid=uid, text=list(history), sampling_params=sampling))

    async def write() -> str | None:
        try:  # 被拒绝了吗：和 HTTP 接口同一个判断、同样的原因（first_replies 拒绝时也清掉 uid 的登记）
            await state.first_replies([uid], param="messages")
        except APIError as e:
            sys.stdout.write(f"(refused: {e.message}; /reset clears the history)")
            return None
        answer = ""
        async for ack in state.wait_for_ack(uid):
            answer += ack.incremental_output
            sys.stdout.write(ack.incremental_output)
            sys.stdout.flush()
        return answer

    task, stopped = asyncio.ensure_future(write()), []
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, lambda: (stopped.append(True), task.cancel()))
    try:
        answer: str | None = await task
    except asyncio.CancelledError:
        if not stopped:  # 不是 Ctrl-C，是外面在取消整个 shell
            raise
        await state.abort_users([uid])
        answer = None
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    sys.stdout.write("\n(stopped)\n" if stopped else "\n")
    return answer

if __name__ == "__main__":
    from minisgl.server.launch import launch_server

    sys.exit(launch_server(sys.argv[1:], run_shell=True))
