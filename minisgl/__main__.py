# Tangled from book/chapters/ch15_server.ipynb — edit the notebook, not this file.
"""python -m minisgl：启动 OpenAI 兼容的服务（加 --shell 在终端里对话）。"""
import sys

from minisgl.server.launch import launch_server

if __name__ == "__main__":
    sys.exit(launch_server())
