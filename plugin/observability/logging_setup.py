"""Structured logs: `key=value` text or one JSON object per line.

Why: operators grep and ship these logs; every message carries its facts as
fields (`resource=nvidia.com/gpu socket=...`) instead of prose. Quiet at
INFO: one line per registration, restart or topology change, none per RPC.
"""

from __future__ import annotations

import json
import logging
import sys
import time

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        parts = [ts, record.levelname.lower(), record.name, record.getMessage()]
        for k, v in _fields(record).items():
            text = str(v)
            parts.append(f"{k}={json.dumps(text) if (' ' in text or not text) else text}")
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in _fields(record).items():
            out[k] = v if isinstance(v, (int, float, bool, type(None))) else str(v)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


class _Held(logging.Handler):
    """Records logged before the log level and format are known, kept to be written once they are.

    Why: the options (log level and format among them) are resolved from flags,
    environment and the config file, and reading the config file already logs
    (an NVIDIA setting ignored, the `gfd` section). Without this, those lines
    reached Python's last-resort handler: message only, no fields, never JSON,
    nothing below WARNING.
    """

    LIMIT = 1000

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.records) < self.LIMIT:
            self.records.append(record)
        else:
            self.dropped += 1


def hold_early_logs() -> None:
    """Keep every record until `setup_logging` (or `release_early_logs`) writes them in its format."""
    root = logging.getLogger()
    if not any(isinstance(h, _Held) for h in root.handlers):
        root.addHandler(_Held())
        root.setLevel(logging.DEBUG)


def _take_held() -> _Held | None:
    root = logging.getLogger()
    held = next((h for h in root.handlers if isinstance(h, _Held)), None)
    if held is not None:
        root.removeHandler(held)
    return held


def _replay(held: _Held | None, handler: logging.Handler, level: int) -> None:
    if held is None:
        return
    for record in held.records:
        if record.levelno >= level and logging.getLogger(record.name).isEnabledFor(record.levelno):
            handler.handle(record)
    if held.dropped:
        handler.handle(logging.makeLogRecord({"name": __name__, "levelno": logging.WARNING, "levelname": "WARNING",
                                              "msg": "early log lines dropped", "dropped": held.dropped}))


def release_early_logs(level: str = "warning") -> None:
    """For commands that never set up logging (the offline ones): from now on, and for the held
    records, text lines with their fields at `level` and above on stderr. A no-op unless
    `hold_early_logs` ran (the real entry point; tests calling the commands in-process keep theirs)."""
    if not any(isinstance(h, _Held) for h in logging.getLogger().handlers):
        return
    setup_logging(level, "text")


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    held = _take_held()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    _replay(held, handler, root.level)
    # Third-party chatter stays out of INFO.
    for noisy in ("watchdog", "grpc", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
