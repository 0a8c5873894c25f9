"""The pieces that keep requests bounded, on their own: the rate-limited log, the search pool, ID lists."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from google.protobuf.message import DecodeError

from allocator.request import brief_ids
from plugin.observability.ratelimited_log import RateLimitedLog, UndecodableRequestLog, reason_kind
from plugin.allocation.search_pool import SearchPool


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_rate_limited_log_summarises_each_window(caplog):
    caplog.set_level(logging.WARNING)
    clock = _Clock()
    limited = RateLimitedLog(logging.getLogger("t.limited"), burst=3, window_s=60, clock=clock)
    for _ in range(1000):
        limited.warning(("Allocate", "r", "unknown"), "rejected request", {"reason": "unknown"})
    limited.warning(("Allocate", "r", "empty"), "rejected request", {"reason": "empty"})
    assert caplog.text.count("rejected request") == 4  # 3 of one kind, 1 of another
    limited.flush()
    assert "suppressed" not in caplog.text  # the window has not ended yet
    clock.now = 61
    limited.flush()
    summaries = [r for r in caplog.records if r.getMessage() == "suppressed similar log lines"]
    assert [(r.suppressed, r.reason) for r in summaries] == [(997, "unknown")]
    # a new window logs again
    limited.warning(("Allocate", "r", "unknown"), "rejected request", {"reason": "unknown"})
    assert caplog.text.count("rejected request") == 5


def test_rate_limited_log_bounds_its_keys(caplog):
    caplog.set_level(logging.WARNING)
    limited = RateLimitedLog(logging.getLogger("t.keys"), burst=1, window_s=60, max_keys=10, clock=_Clock())
    for n in range(10000):
        limited.warning(("m", n), "rejected request", {"n": n})
    assert caplog.text.count("rejected request") == 11  # ten keys, then one shared overflow key
    limited.flush(force=True)
    assert [r.suppressed for r in caplog.records if r.getMessage() == "suppressed similar log lines"] == [9989]


def test_only_grpc_decode_errors_are_rate_limited_other_grpc_errors_keep_their_traceback(caplog):
    caplog.set_level(logging.WARNING)
    grpc_log = logging.getLogger(UndecodableRequestLog.LOGGER)
    limited = RateLimitedLog(logging.getLogger("t.decode"), burst=2, window_s=60, clock=_Clock())

    def servicer_failed(error: Exception) -> None:
        try:
            raise error
        except Exception:  # noqa: BLE001 (grpc's own handler, as the code under test sees it)
            grpc_log.exception("Unexpected [%s] raised by servicer method [%s]", type(error).__name__, "/m")

    with UndecodableRequestLog(limited):
        for _ in range(50):
            servicer_failed(DecodeError("Wire format was corrupt"))
        servicer_failed(KeyError("a bug in our handler"))
    servicer_failed(DecodeError("after the daemon stopped"))  # the filter is gone with the daemon
    decoded = [r for r in caplog.records if r.getMessage().startswith("could not decode")]
    assert len(decoded) == 2 and decoded[0].error == "DecodeError: Wire format was corrupt"
    raised = [r for r in caplog.records if r.name == UndecodableRequestLog.LOGGER]
    assert [type(r.exc_info[1]).__name__ for r in raised] == ["KeyError", "DecodeError"]


def test_reason_kind_ignores_ids_numbers_and_position():
    assert reason_kind("container_requests[3]: allocation_size 9 exceeds the 8 available devices") == \
        reason_kind("container_requests[0]: allocation_size 2 exceeds the 1 available devices")
    assert reason_kind("unknown device IDs for r: a, b") == reason_kind("unknown device IDs for r: c")
    assert reason_kind("unknown device IDs for r: a") != reason_kind("repeated device IDs: a")


def test_brief_ids_names_a_few_cut_and_escaped():
    assert brief_ids(["a", "b"]) == "a, b"
    assert brief_ids([str(i) for i in range(12)]) == "0, 1, 2, 3, 4 +7 more"
    long = brief_ids(["x" * 5000])
    assert long.startswith("x" * 48) and long.endswith("...(5000 chars)") and len(long) < 80
    assert brief_ids(["a\nb", "\x1b[31m"]) == "a\\nb, \\x1b[31m"


async def test_search_pool_runs_off_the_loop_and_passes_errors_back():
    pool = SearchPool(workers=2)
    try:
        assert await pool.run(threading.current_thread) is not threading.current_thread()

        def boom() -> None:
            raise ValueError("bad request")

        with pytest.raises(ValueError, match="bad request"):
            await pool.run(boom)
        # two slow jobs run side by side: a third caller waits for one of them, not for both
        gate = threading.Event()
        slow = [asyncio.ensure_future(pool.run(gate.wait, 30)) for _ in range(2)]
        quick = asyncio.ensure_future(pool.run(lambda: "quick"))
        await asyncio.sleep(0.2)
        assert not quick.done()  # both workers are busy
        ran: list[str] = []
        dropped = asyncio.ensure_future(pool.run(ran.append, "dropped"))
        await asyncio.sleep(0)
        dropped.cancel()  # cancelled before its turn: never runs
        gate.set()
        assert await quick == "quick" and all(await asyncio.gather(*slow))
        await pool.run(lambda: None)
        assert ran == []
    finally:
        pool.close()
