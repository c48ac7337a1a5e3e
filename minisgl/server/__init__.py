# Tangled from book/chapters/ch15_server.ipynb — edit the notebook, not this file.
from .api_server import FrontendManager, app
from .args import ServerArgs, parse_args
from .launch import launch_server, start_backend

__all__ = ["FrontendManager", "ServerArgs", "app", "launch_server", "parse_args", "start_backend"]
