"""Where a request's first token waits, inside the server (bench_serving.py --stages).

bench_serving.py puts this folder first on the server's PYTHONPATH and sets TTFT_TRACE_DIR, so that Python imports
this file at start-up in the launcher and in every worker process. Right after each of three minisgl modules is
imported, a few of its methods are wrapped to write one line per request and stage, "uid stage unix-time", to
TTFT_TRACE_DIR/<pid>.txt (line-buffered: workers are terminated, not asked to exit). Only the first time a request
reaches a stage is kept. The engine itself knows nothing about this; a renamed method fails the import loudly.

  api_recv     API server: the HTTP request became a request (FrontendManager.new_users)
  api_sent     API server: its TokenizeMsg is about to be handed to ZMQ (FrontendManager.send_one called)
  tok_start    tokenizer process: starts tokenizing it           tok_done  ... done
  sched_recv   scheduler: receives it (Scheduler.add_request)
  launch       scheduler: first step that includes it is launched (its first prefill chunk)
  sched_first  scheduler: sends its first token (Scheduler.send_result)
  detok        detokenizer: its first reply is ready
  api_reply    API server: the first reply arrived (before it is written to the HTTP stream)
"""
import os
import sys
import time

TRACE_DIR = os.environ.get("TTFT_TRACE_DIR")

if TRACE_DIR:
    import importlib.abc
    import importlib.util

    _out = None
    _seen = set()

    def record(uid: int, stage: str) -> None:
        global _out
        if (uid, stage) in _seen:
            return
        _seen.add((uid, stage))
        if _out is None:
            _out = open(os.path.join(TRACE_DIR, f"{os.getpid()}.txt"), "a", buffering=1)
        _out.write(f"{uid} {stage} {time.time():.6f}\n")

    def _patch_tokenizer(m) -> None:
        loop = m.TokenizerLoop
        tokenize, detokenize = loop._tokenize, loop._detokenize

        def _tokenize(self, msg, out):
            record(msg.uid, "tok_start")
            tokenize(self, msg, out)
            record(msg.uid, "tok_done")

        def _detokenize(self, msg, out):
            n = len(out.frontend)
            detokenize(self, msg, out)
            if len(out.frontend) > n:  # a reply for the API server came out of this token
                record(msg.uid, "detok")

        loop._tokenize, loop._detokenize = _tokenize, _detokenize

    def _patch_scheduler(m) -> None:
        sched = m.Scheduler
        add_request, launch, send_result = sched.add_request, sched.launch, sched.send_result

        def _add_request(self, msg):
            record(msg.uid, "sched_recv")
            return add_request(self, msg)

        def _launch(self, batch, last=None):
            if not batch.is_decode:  # a request's first launch is a prefill chunk: decode steps have nothing new
                for req in batch.reqs:
                    record(req.uid, "launch")
            return launch(self, batch, last)

        def _send_result(self, replies):
            for r in replies:
                if r.next_token != -1:  # -1: aborted, no token
                    record(r.uid, "sched_first")
            return send_result(self, replies)

        sched.add_request, sched.launch, sched.send_result = _add_request, _launch, _send_result

    def _patch_api_server(m) -> None:
        frontend = m.FrontendManager
        new_users, send_one, unwrap = frontend.new_users, frontend.send_one, m._unwrap

        def _new_users(self, n=1):
            uids = new_users(self, n)
            for uid in uids:
                record(uid, "api_recv")
            return uids

        async def _send_one(self, msg):
            if isinstance(msg, m.TokenizeMsg):  # before the await: its resumption can come after the tokenizer started
                record(msg.uid, "api_sent")
            await send_one(self, msg)

        def _unwrap(msg):
            replies = unwrap(msg)
            for r in replies:
                if isinstance(r, m.UserReply):
                    record(r.uid, "api_reply")
            return replies

        frontend.new_users, frontend.send_one, m._unwrap = _new_users, _send_one, _unwrap

    PATCHES = {"minisgl.tokenizer.server": _patch_tokenizer, "minisgl.scheduler.scheduler": _patch_scheduler,
               "minisgl.server.api_server": _patch_api_server}

    class _PatchAfterImport(importlib.abc.MetaPathFinder):
        """Finds the module as usual, then wraps its loader so that the patch runs right after the module body."""

        def find_spec(self, name, path, target=None):
            if name not in PATCHES:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            exec_module = spec.loader.exec_module

            def _exec_module(module):
                exec_module(module)
                PATCHES[name](module)

            spec.loader.exec_module = _exec_module
            return spec

    sys.meta_path.insert(0, _PatchAfterImport())
