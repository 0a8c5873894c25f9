"""Prepared claims, kept on disk so a restart neither loses nor repeats a preparation.

Why a file and why this shape:
- The kubelet calls NodePrepareResources again for claims it has not seen
  prepared (after its own restart, or ours) and NodeUnprepareResources when a
  pod is done, possibly against a different instance of the driver during a
  rolling update (both instances serve at once, the kubelet picks either). So
  the truth about what is prepared must live outside any one process.
- Changes come in batches: the claim preparer records a whole batch of claims
  (a call's worth, up to `PrepareLimits.batch`) in one change, so a call with
  1,500 claims rewrites and fsyncs the file a few dozen times, not 1,500.
- Every change takes an exclusive `flock` on `<plugin dir>/serialize.lock`
  (a fresh open file per change, so changes in one process exclude each other too),
  reads the file, changes it and writes it back atomically (temp file, fsync,
  rename, fsync of the directory). Two instances never interleave, and a crash
  leaves either the old or the new file, never half of one.
- The file carries a checksum of its claims, so a truncated or edited file is
  refused with an error naming it instead of being half-trusted.
- The parsed claims are kept with the bytes they came from (issue 24): a read
  whose bytes are the same (whoever wrote them, this instance or another) takes
  them without parsing and checking the file again. `read()`, which only looks
  (what is already prepared, before the claims are read from the API server),
  reads the bytes on the loop without the lock (the file is only ever replaced
  whole, by a rename) and goes to a worker thread only when they changed; what
  it gives is a hint, every change re-reads under the lock.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
from collections.abc import Callable
from typing import Any, TypeVar

from ...atomic_file import replace_file
from ...errors import InputError
from ..claims.prepared import PreparedClaim

FORMAT_VERSION = 1
T = TypeVar("T")


class CheckpointError(InputError):
    """The checkpoint file cannot be trusted; the message names it and the fix."""


def _checksum(claims: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _encode(head: dict[str, Any], claims: dict[str, Any]) -> str:
    """The file's text: one line per claim, so it stays readable (and diffable) without `indent`, which
    would switch `json` to its pure-Python encoder (many times slower on a file of 1,500 claims)."""
    lines = [f"{json.dumps(uid)}: {json.dumps(c, sort_keys=True)}" for uid, c in claims.items()]
    top = json.dumps(head, sort_keys=True)[1:-1]
    return "{" + top + ', "claims": {' + ("\n" + ",\n".join(lines) + "\n" if lines else "") + "}}\n"


class ClaimCheckpoint:
    """The prepared-claims file of one driver, shared by all of its instances on the node."""

    def __init__(self, path: str, lock_path: str, driver: str):
        self.path = path
        self.lock_path = lock_path
        self.driver = driver
        #: Times the file was written (each write is a full rewrite plus two fsyncs): benchmarks and tests.
        self.writes = 0
        #: Locked sections running in worker threads now; their callers may already have gone.
        self.pending = 0
        #: The file's last bytes seen (read or written) and its claims parsed from them; None: no file.
        self._parsed: tuple[bytes | None, dict[str, PreparedClaim]] = (None, {})

    def _raw(self) -> bytes | None:
        try:
            with open(self.path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _cached(self, raw: bytes | None) -> dict[str, PreparedClaim] | None:
        """A copy of the claims parsed from `raw` when they were the last bytes seen; None otherwise."""
        seen, claims = self._parsed
        return dict(claims) if raw == seen else None

    # -- file format ---------------------------------------------------------
    def _read(self) -> dict[str, PreparedClaim]:
        raw = self._raw()
        cached = self._cached(raw)
        if cached is not None:
            return cached
        claims = self._parse(raw) if raw is not None else {}
        self._parsed = (raw, dict(claims))
        return claims

    def _parse(self, raw: bytes) -> dict[str, PreparedClaim]:
        fix = ("move it aside only after checking that no pod on this node uses a claim of "
               f"{self.driver} (kubectl get resourceclaims -A), then restart the driver")
        try:
            data = json.loads(raw)
            claims = data["claims"]
            if data.get("version") != FORMAT_VERSION:
                raise CheckpointError(f"checkpoint {self.path}: format version {data.get('version')!r} "
                                      f"is not {FORMAT_VERSION} (written by another release?); {fix}")
            if data.get("checksum") != _checksum(claims):
                raise CheckpointError(f"checkpoint {self.path}: checksum mismatch (truncated or edited); {fix}")
            return {uid: PreparedClaim.from_json(c) for uid, c in claims.items()}
        except CheckpointError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"checkpoint {self.path}: not a valid checkpoint ({e}); {fix}") from None

    def _write(self, claims: dict[str, PreparedClaim]) -> None:
        body = {uid: c.to_json() for uid, c in sorted(claims.items())}
        text = _encode({"version": FORMAT_VERSION, "driver": self.driver, "checksum": _checksum(body)}, body)
        replace_file(self.path, text, mode=0o600, prefix=".checkpoint-", durable=True)
        self._parsed = (text.encode("utf-8"), dict(claims))
        self.writes += 1

    def _acquire(self) -> int:
        """An exclusive flock on the lock file; closing the returned descriptor releases it."""
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        return fd

    # -- operations (each one a locked read-modify-write) -------------------
    def load(self) -> dict[str, PreparedClaim]:
        """Read the file under the lock (blocking; for start-up and tests)."""
        fd = self._acquire()
        try:
            return self._read()
        finally:
            os.close(fd)

    def check(self) -> int:
        """Raise CheckpointError if the file is unusable; else the number of prepared claims."""
        return len(self.load())

    def update_sync(self, change: Callable[[dict[str, PreparedClaim]], T]) -> T:
        """Lock, read, `change(claims)` (may edit the dict), write back if it changed, unlock."""
        fd = self._acquire()
        try:
            claims = self._read()
            before = dict(claims)
            result = change(claims)
            if claims != before:
                self._write(claims)
            return result
        finally:
            os.close(fd)

    async def read(self) -> dict[str, PreparedClaim]:
        """The prepared claims (nothing is written): from the bytes read on the loop when they are the last
        ones seen, else read and checked under the lock in a worker thread. A snapshot, as any read is once
        the lock is released: a change decides under the lock again."""
        cached = self._cached(self._raw())
        if cached is not None:
            return cached
        return await self.update(lambda claims: dict(claims))

    async def update(self, change: Callable[[dict[str, PreparedClaim]], T]) -> T:
        """`update_sync` in a worker thread, so a slow disk or the other instance holding the lock
        never stalls the event loop.

        Shielded: when the caller is cancelled (the kubelet's deadline passed) the
        thread still finishes the whole locked section and releases the lock; a
        half-done read-modify-write or a lock held forever cannot happen. The
        caller returns at once; `pending` counts the sections still running.
        """
        self.pending += 1
        work = asyncio.ensure_future(asyncio.to_thread(self.update_sync, change))
        work.add_done_callback(self._done)
        return await asyncio.shield(work)

    def _done(self, _: asyncio.Future) -> None:
        self.pending -= 1
