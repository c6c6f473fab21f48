"""Every mistake a user can make ends in one ``seqmix: error:`` line that says what to do, exit status 2; anything
else is a bug and ends in one ``seqmix: internal error:`` line naming a file that holds its traceback, exit status 1.

Three kinds reach the entry points: seqmix's own ``SeqmixError`` (bad data, checkpoints, settings), the config
mistakes Hydra and OmegaConf catch (an unknown group choice, a misspelled key, an override that does not parse, a
required value left out, an option a class does not take), and the file system's refusals (a full disk, an
unwritable or impossible output folder). ``command_status`` runs a side command (``python -m seqmix.report``, the
interop commands) under the same rules; the Hydra commands use ``seqmix.cli.runner``.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from hydra.errors import InstantiationException, MissingConfigException, OverrideParseException
from lightning.fabric.utilities.exceptions import MisconfigurationException
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    MissingMandatoryValue,
    OmegaConfBaseException,
)

from seqmix.errors import SeqmixError

UNKNOWN_KEY = (ConfigKeyError, ConfigAttributeError)
OVERRIDE_GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"

# what to do when the file system refuses a write
FILE_SYSTEM_HINTS = {
    errno.ENOSPC: "free some disk space or write elsewhere (hydra.run.dir=... / paths.log_dir=...)",
    errno.EDQUOT: "free some of your disk quota or write elsewhere (hydra.run.dir=... / paths.log_dir=...)",
    errno.EFBIG: "the file size limit (ulimit -f) was reached: raise it or write elsewhere",
    errno.EACCES: "make it writable or choose another folder (hydra.run.dir=... / paths.log_dir=...)",
    errno.EPERM: "make it writable or choose another folder (hydra.run.dir=... / paths.log_dir=...)",
    errno.EROFS: "the file system is read-only: choose another folder (hydra.run.dir=... / paths.log_dir=...)",
    errno.ENOTDIR: "part of that path is a file, not a folder: choose another path",
    errno.EISDIR: "that path is a folder: give a file name",
    errno.EEXIST: "a file is in the way of that folder: choose another path",
    errno.ENOENT: "a folder on that path does not exist and cannot be created there: check the path",
}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _did_you_mean(name: str, options) -> str:
    close = difflib.get_close_matches(name, [str(o) for o in options], n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _missing_choice(err: MissingConfigException) -> str:
    group, _, name = (err.missing_cfg_file or "").rpartition("/")
    if not group or not err.options:
        return f"{_one_line(str(err).split('Config search path')[0])}; check the config name"
    dotted = group.replace("/", ".")
    choices = ", ".join(sorted(err.options))
    return (f"{dotted}={name}: there is no such {dotted} config{_did_you_mean(name, err.options)}; "
            f"choose one of: {choices}")


def _unknown_key(err: OmegaConfBaseException, override: str | None) -> str:
    key = err.full_key or str(err.key)
    parent = err.parent_node
    options = list(parent.keys()) if hasattr(parent, "keys") else []
    leaf = key.rsplit(".", 1)[-1]
    hint = _did_you_mean(leaf, options)
    if hint and "." in key:
        hint = hint.replace("mean ", f"mean {key.rsplit('.', 1)[0]}.")
    add = f"; to add a new key write +{override}" if override else ""
    return f"{key}: no such key in the config{hint}{add}"


def _lightning_refused(err: BaseException) -> bool:
    """A ValueError raised by Lightning's own code (its loops check settings only once they meet the data, e.g. a
    validation interval longer than the epoch): Lightning's words for a setting it refuses."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    module = tb.tb_frame.f_globals.get("__name__", "") if tb is not None else ""
    return isinstance(err, ValueError) and module.startswith(("lightning.pytorch.", "lightning.fabric."))


def describe(err: BaseException) -> str | None:
    """The one-line message for a user's mistake, or None when ``err`` is not one (a bug: keep its traceback)."""
    if isinstance(err, SeqmixError):
        return str(err)
    if isinstance(err, MissingConfigException):
        return _missing_choice(err)
    if isinstance(err, OverrideParseException):
        detail = _one_line(str(err).replace(f"Error parsing override '{err.override}'", "").split("See http")[0])
        return (f"cannot parse the override '{err.override}' ({detail}); quote values with spaces, brackets or "
                f"commas, e.g. 'key=\"a b\"' (grammar: {OVERRIDE_GRAMMAR})")
    cause = err.__cause__
    if isinstance(err, UNKNOWN_KEY) or isinstance(cause, UNKNOWN_KEY):
        key_err = err if isinstance(err, UNKNOWN_KEY) else cause
        override = None
        message = str(err)
        if "use +" in message:  # Hydra's "To append to your config use +key=value"
            override = message.split("use +", 1)[1].split()[0]
        return _unknown_key(key_err, override)
    if isinstance(err, MissingMandatoryValue):
        return f"{err.full_key} has no value and is required: add {err.full_key}=..."
    if isinstance(err, InstantiationException) and isinstance(cause, (TypeError, ValueError, MisconfigurationException)):
        where = str(err).split("full_key:")[-1].strip() if "full_key:" in str(err) else "the config"
        if isinstance(cause, TypeError):  # an option the class does not take, or a required one left out
            return (f"{where}: {cause}; remove, rename or add that option (`python train.py --cfg job` shows the "
                    "composed config)")
        return f"{where}: {_one_line(str(cause))}; fix that {where}.* setting"
    if isinstance(err, MisconfigurationException) or _lightning_refused(err):  # Lightning's "a setting is wrong"
        return f"{_one_line(str(err))} (fix that setting; `python train.py --cfg job` shows the composed config)"
    if isinstance(err, OmegaConfBaseException) or type(err).__module__.startswith("hydra."):
        return _one_line(str(err).replace("Set the environment variable HYDRA_FULL_ERROR=1", ""))
    if isinstance(err, OSError) and err.errno in FILE_SYSTEM_HINTS:
        where = f": {err.filename}" if err.filename else ""
        return f"{err.strerror or err}{where} ({FILE_SYSTEM_HINTS[err.errno]})"
    return None


def user_error_in(err: BaseException | None) -> tuple[BaseException, str] | None:
    """The user's mistake behind ``err`` and its message: a SeqmixError anywhere in the chain first (Hydra's
    instantiate and Lightning wrap the errors raised inside them), else the first link ``describe`` knows."""
    chain = []
    while err is not None and err not in chain:
        chain.append(err)
        err = err.__cause__ or err.__context__
    for link in sorted(chain, key=lambda e: not isinstance(e, SeqmixError)):
        message = describe(link)
        if message is not None:
            return link, message
    return None


def report_user_error(message: str) -> NoReturn:
    print(f"seqmix: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def write_traceback(err: BaseException, log_dir: str | os.PathLike | None = None) -> Path:
    """``err``'s traceback in a new file under ``<log_dir>/errors`` (the system's temporary folder when there is no
    log folder, or it cannot be written), so the terminal gets one line and the bug report gets everything."""
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    name = f"{time.strftime('%Y-%m-%d_%H-%M-%S')}-{os.getpid()}.txt"
    for folder in ([Path(log_dir) / "errors"] if log_dir else []) + [Path(tempfile.gettempdir()) / "seqmix-errors"]:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text, encoding="utf-8")
            return folder / name
        except OSError:
            continue
    raise err


def internal_error_line(err: BaseException, where: Path) -> str:
    first = " ".join(str(err).split())[:300] or "(no message)"
    return (f"seqmix: internal error: {type(err).__name__}: {first} (a bug in seqmix, not in what you ran; the "
            f"traceback is in {where}: please report it)")


def report_internal_error(err: BaseException, log_dir: str | os.PathLike | None = None) -> NoReturn:
    print(internal_error_line(err, write_traceback(err, log_dir)), file=sys.stderr, flush=True)
    sys.exit(1)


class CommandParser(argparse.ArgumentParser):
    """A side command's argument parser whose mistakes end like every other user error: one ``seqmix: error:`` line
    (with where to find the usage) and exit status 2, instead of argparse's usage block and its own error line."""

    def error(self, message: str):
        print(f"seqmix: error: {message} (`{self.prog} -h` shows the usage)", file=sys.stderr, flush=True)
        sys.exit(2)


def command_status(action: Callable[[], object]) -> int:
    """Run a side command's work: 0; a user error: one ``seqmix: error:`` line and 2; anything else: one
    ``seqmix: internal error:`` line naming its traceback file, and 1."""
    try:
        action()
    except Exception as raised:
        found = user_error_in(raised)
        if found is not None:
            print(f"seqmix: error: {found[1]}", file=sys.stderr, flush=True)
            return 2
        print(internal_error_line(raised, write_traceback(raised, os.environ.get("SEQMIX_LOG_DIR"))),
              file=sys.stderr, flush=True)
        return 1
    return 0
