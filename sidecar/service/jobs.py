"""What captures and sync scans share: one job at a time, a timeout, background tasks."""

from __future__ import annotations

import asyncio
from typing import Any


class OneJobAtATime:
    """Base of CaptureManager and ScanManager. A job has ``request.timeout_s`` and ``done_event``;
    subclasses set ``self._active`` and implement ``_request_stop(job, reason)``."""

    def __init__(self) -> None:
        self._active: Any = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def active(self) -> Any:
        return self._active

    async def _request_stop(self, job: Any, reason: str) -> None:
        raise NotImplementedError

    async def _watch_timeout(self, job: Any) -> None:
        try:
            await asyncio.wait_for(job.done_event.wait(), job.request.timeout_s)
        except asyncio.TimeoutError:
            if job is self._active:
                await self._request_stop(job, f"timeout after {job.request.timeout_s:g} s")

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
