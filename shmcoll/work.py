"""Work objects returned by every ProcessGroupShm method."""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


class CompletedWork(dist.Work):
    """A collective that already finished on this rank when the call returned."""

    def __init__(self, result=None):
        super().__init__()
        self._result = result if result is not None else []

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def result(self):
        return self._result

    def synchronize(self) -> None:
        return None

    def get_future(self) -> torch.futures.Future:
        future = torch.futures.Future()
        future.set_result(self._result)
        return future
