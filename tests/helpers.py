"""Running the real entry points in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A toy run that takes seconds: tiny data, tiny model, few steps.
TINY = [
    "logger=csv",
    "task.data.source.num_train=400",
    "task.data.source.num_valid=40",
    "task.data.source.num_test=40",
    "model.embed_dim=32",
    "model.encoder.layers=1",
    "model.decoder.layers=1",
    "model.encoder.ffn_dim=64",
    "model.decoder.ffn_dim=64",
    "model.encoder.heads=2",
    "model.decoder.heads=2",
    "model.decoder.cross_attention_heads=2",
    "~callbacks.progress_bar",
]


# models of a few thousand weights, built directly (no training run): decoding, scoring and API tests
TINY_TRANSFORMER = ["model=transformer_small", "model.embed_dim=16", "model.encoder.layers=1",
                    "model.decoder.layers=1", "model.encoder.ffn_dim=32", "model.decoder.ffn_dim=32",
                    "model.encoder.heads=2", "model.decoder.heads=2", "model.decoder.cross_attention_heads=2"]
TINY_LM = ["task=wikitext2", "model.embed_dim=16", "model.decoder.layers=1", "model.decoder.ffn_dim=32",
           "model.decoder.heads=2", "task.adaptive.input=false", "task.adaptive.softmax=false",
           "task.data.tokens_per_sample=32"]


def random_checkpoint(path, overrides: list[str], tokenizer, seed: int, std: float = 0.5, seed_first: bool = False):
    """A checkpoint of the model ``overrides`` build, its weights drawn from N(0, std) (far from the initialization,
    so that two seeds decode differently); ``seed_first``: the seed is set before the model is built."""
    import torch

    from seqmix.config.build import build_task
    from seqmix.interop.fairseq import save_seqmix_checkpoint

    if seed_first:
        torch.manual_seed(seed)
    task = build_task(run_config(overrides), tokenizer)
    if not seed_first:
        torch.manual_seed(seed)
    for p in task.model.parameters():
        p.data.normal_(0, std)
    save_seqmix_checkpoint(path, task)
    return str(path)

# variables torch, Lightning or Triton read when imported: a run that changes one gets a fresh interpreter
IMPORT_TIME_VARIABLES = ("CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET", "TRITON_DEFAULT_FP_FUSION", "OMP_NUM_THREADS",
                         "MKL_NUM_THREADS", "PYTHONPATH", "PYTHONHASHSEED")


def run(script: str, args: list[str], log_dir: Path, timeout: int = 600, env: dict | None = None,
        preexec_fn=None) -> subprocess.CompletedProcess:
    """``python <script> <args>`` in ``log_dir`` (``python -m <script>`` when ``script`` is a dotted module name, not a
    .py file): forked from the test process's fork server (tests/forkserver.py) unless ``preexec_fn`` or an
    import-time variable asks for a fresh interpreter (or SEQMIX_TEST_FORKSERVER=0)."""
    from tests import forkserver

    log_dir.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "SEQMIX_LOG_DIR": str(log_dir), "WANDB_MODE": os.environ.get("WANDB_MODE", "offline"),
                "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env = {k: v for k, v in full_env.items() if v is not None}  # None in env: unset it
    fresh = (preexec_fn is not None or os.environ.get("SEQMIX_TEST_FORKSERVER") == "0"
             or any(full_env.get(k) != os.environ.get(k) for k in IMPORT_TIME_VARIABLES))
    module = not script.endswith(".py")
    if not fresh:
        return forkserver.server().run(script if module else ROOT / script, args, log_dir, full_env, timeout,
                                       module=module)
    command = ["-m", script] if module else [str(ROOT / script)]
    return subprocess.run([sys.executable, *command, *args], cwd=log_dir, env=full_env,
                          capture_output=True, text=True, timeout=timeout, preexec_fn=preexec_fn)


def run_config(overrides: list[str], keep_hydra: bool = False):
    """train.yaml composed as train.py composes it, with Hydra's node made current so that ``${hydra:...}`` resolves
    outside a run; then without that node (what a checkpoint stores) unless ``keep_hydra``."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from seqmix.config.resolvers import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    if not keep_hydra:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


def describe(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"


def fake_scontrol(folder: Path) -> tuple[Path, Path, Path]:
    """A stand-in ``scontrol`` in ``folder/bin`` (put it on PATH) that appends its arguments to ``calls`` and exits
    with the status written in ``status`` (0 at first; otherwise it says ``scontrol: error: denied``).
    Returns (bin folder, calls, status)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls, status = folder / "scontrol_calls", folder / "scontrol_status"
    status.write_text("0")
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\ncode=$(cat {status})\n'
                      f'[ "$code" = 0 ] || echo "scontrol: error: denied" >&2\nexit $code\n')
    script.chmod(0o755)
    return bin_dir, calls, status


class FileServer:
    """A loopback HTTP server (port 0) serving ``files`` ({URL path: bytes}) with Range requests, in a thread: the
    download tests' stand-in for a corpus's host. ``requests`` records (path, Range header) of each GET;
    ``honour_range=False`` makes it answer every request with the whole file, as some servers do; ``cut_after=N``
    makes the next response stop after N bytes of its body (the connection drops), once."""

    def __init__(self, files: dict[str, bytes]):
        import threading
        from http.server import ThreadingHTTPServer

        self.files, self.requests, self.honour_range, self.cut_after = dict(files), [], True, None
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _range_handler(self))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _range_handler(server: FileServer):
    import re
    from http.server import BaseHTTPRequestHandler

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            asked = self.headers.get("Range")
            server.requests.append((self.path, asked))
            body = server.files.get(self.path)
            if body is None:
                self.send_error(404)
                return
            found = re.fullmatch(r"bytes=(\d+)-", asked or "") if server.honour_range else None
            start = int(found.group(1)) if found else 0
            if start >= len(body) and found:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206 if found else 200)
            if found:
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            self.send_header("Content-Length", str(len(body) - start))
            self.end_headers()
            cut, server.cut_after = server.cut_after, None
            self.wfile.write(body[start:] if cut is None else body[start:start + cut])
            self.close_connection = True

        def log_message(self, *args):
            pass

    return Handler
