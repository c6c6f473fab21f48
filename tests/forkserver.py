"""Run an entry point many times without paying its imports each time: one server interpreter imports torch,
Lightning and Hydra once (about 4 s of every start-up), then forks a child per run that runs the script as
``python script args`` would: its own working directory, environment, argv, stdin from /dev/null, stdout and stderr
to files, exit status (SystemExit's code, 1 and a traceback for an uncaught exception) and atexit handlers.

Only for runs whose environment does not change what those three libraries read at import (the CUDA and Triton
variables): ``tests.helpers.run`` keeps a fresh interpreter for the others."""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

SERVER = r'''
import atexit, json, os, runpy, sys, traceback
import hydra, lightning, omegaconf, torch  # noqa: F401  what every entry point imports first

def child(req):
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    module = req.get("module")
    sys.argv = [module or req["script"], *req["args"]]
    sys.path[0] = req["cwd"] if module else os.path.dirname(req["script"])
    code = 0
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(req["script"], run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    return code

replies = os.fdopen(os.dup(1), "w", buffering=1)
for line in sys.stdin:
    req = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        replies.close()
        os._exit(child(req))
    replies.write(json.dumps({"pid": pid}) + "\n")
    _, status = os.waitpid(pid, 0)
    replies.write(json.dumps({"code": os.waitstatus_to_exitcode(status)}) + "\n")
'''


class ForkServer:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.reader = ThreadPoolExecutor(1)
        atexit.register(self.close)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(30)
        self.reader.shutdown(wait=False)

    def _reply(self, timeout: float | None) -> dict:
        line = self.reader.submit(self.proc.stdout.readline).result(timeout)
        if not line:
            raise RuntimeError(f"the fork server died (exit {self.proc.poll()})")
        return json.loads(line)

    def run(self, script: Path | str, args: list[str], cwd: Path, env: dict, timeout: float,
            module: bool = False) -> subprocess.CompletedProcess:
        """``python script args``, or ``python -m script args`` with ``module``."""
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"script": str(script), "args": [str(a) for a in args], "cwd": str(cwd), "env": env,
                       "stdout": str(out), "stderr": str(err), **({"module": str(script)} if module else {})}
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            pid = self._reply(60)["pid"]
            try:
                code = self._reply(timeout)["code"]
            except FutureTimeout:
                os.kill(pid, signal.SIGKILL)
                self._reply(60)
                raise subprocess.TimeoutExpired([script, *args], timeout, out.read_text(), err.read_text()) from None
            return subprocess.CompletedProcess([sys.executable, str(script), *args], code,
                                               out.read_text(errors="replace"), err.read_text(errors="replace"))


_server: ForkServer | None = None


def server() -> ForkServer:
    """This test process's server, started on first use."""
    global _server
    if _server is None or _server.proc.poll() is not None:
        _server = ForkServer()
    return _server
