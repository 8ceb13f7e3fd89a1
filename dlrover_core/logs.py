"""One logging setup for the CLI (and anything else that runs dlrover-rm as a program).

``setup(level, json_lines=False)`` configures the root logger once: a plain line format on
stderr, or one JSON object a line (``--log-json``: ``ts``, ``level``, ``logger``, ``msg``, and
``exc`` when there is a traceback), for log collectors. Every record passes through
:func:`~dlrover_core.history.redact.redact_text`, so a URL's password never reaches a log line.
Third-party noise (the pynvml deprecation warning torch triggers, the open-source DLRover's
chatter, alembic's notes on each store open, fbgemm's "Successfully loaded" lines, torch.jit's
deprecation warnings) is turned down here as well, at every level. Nodes (``setup_node``) log
in the same format, the master and the CLI's.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import warnings
from typing import Any, TextIO

from dlrover_core.history.redact import redact_text

LEVELS = ("debug", "info", "warning", "error")
PYNVML_FILTER = "ignore:The pynvml package is deprecated:FutureWarning"
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ENV_LOG_JSON = "DLROVER_RM_LOG_JSON"  # nodes inherit the format of the process that starts them


class RedactingFilter(logging.Filter):
    """Hide ``scheme://user:password@`` in every record's message and arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        clean = redact_text(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        return True


class ThirdPartyChatter(logging.Filter):
    """Drop what other libraries log at import (fbgemm's "Successfully loaded: '...so'" lines
    go to the root logger at INFO); what they log at WARNING or above still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        return not (record.name == "root" and str(record.msg).startswith("Successfully loaded"))


class JsonLinesFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + "Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = redact_text(self.formatException(record.exc_info))
        return json.dumps(out, default=str)


def quiet_third_party() -> None:
    """Silence warnings and chatter that are not ours (idempotent)."""
    # torch probes pynvml at import (pulled in by the optional open-source DLRover); the
    # environment variable carries the filter into node processes, whose logs start clean
    warnings.filterwarnings("ignore", message="The pynvml package is deprecated")
    current = os.environ.get("PYTHONWARNINGS", "")
    if PYNVML_FILTER not in current:
        os.environ["PYTHONWARNINGS"] = f"{current},{PYNVML_FILTER}" if current else PYNVML_FILTER
    # the open-source DLRover (only a peer policy in the simulator) reads its level from this
    # variable at import time; its warnings are about its own internals there ("No CPU
    # utilization of PS", "The GRPC service of brain is not available"), not the user's job
    os.environ.setdefault("DLROVER_LOG_LEVEL", "ERROR")
    logging.getLogger("dlrover.logger").setLevel(logging.ERROR)
    # alembic's plugin and migration-context notes on every store open, tornado, urllib3, kfp
    for name in ("alembic", "tornado.access", "urllib3", "kfp"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # torch's own notes when torchrec traces a module, and DCP loading one process's checkpoint
    # view (what the all-reduce evaluation and export do on purpose)
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    warnings.filterwarnings("ignore", message=r"`?torch\.jit\.script(_method)?`? is deprecated")


def setup(
    level: str = "warning", *, json_lines: bool = False, stream: TextIO | None = None
) -> None:
    """Configure the root logger: ``level`` (debug/info/warning/error), plain or JSON lines."""
    lvl = str(level).lower()
    if lvl not in LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    quiet_third_party()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLinesFormatter() if json_lines else logging.Formatter(PLAIN_FORMAT))
    handler.addFilter(RedactingFilter())
    handler.addFilter(ThirdPartyChatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        # ours from an earlier call, or the one a library's module-level ``logging.info`` put
        # there at import (fbgemm does), which would print every record a second time
        fmt = getattr(h.formatter, "_fmt", None)
        if getattr(h, "_dlrover_rm", False) or fmt == logging.BASIC_FORMAT:
            root.removeHandler(h)
    handler._dlrover_rm = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(getattr(logging, lvl.upper()))
    # the nodes this process starts (local processes) log the same way
    os.environ[ENV_LOG_JSON] = "1" if json_lines else "0"


def setup_node(level: str = "info") -> None:
    """A node's logging (``dlrover-rm node ...``): the same line format as the CLI and the
    master, at ``level``, as JSON lines when the process that started it logs JSON lines."""
    setup(level, json_lines=os.environ.get(ENV_LOG_JSON) == "1")
