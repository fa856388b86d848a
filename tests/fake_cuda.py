"""Stands in for torch's CUDA sync debug mode on machines without a GPU (torch's own switch raises
"Torch not compiled with CUDA enabled" there): a switch with torch's values, and a synchronising
operation that does what c10's ``warn_or_error_on_sync`` does, raising torch's warning from the
calling line when the mode is "warn" and an error when it is "error"."""

import warnings

SYNC_WARNING = "called a synchronizing CUDA operation"
FILE = __file__  # a SiteLocator skips it, as it skips torch's own files


class FakeSwitch:
    def __init__(self) -> None:
        self.mode = 0
        self.sets: list[int] = []

    def get(self) -> int:
        return self.mode

    def set(self, mode: int) -> None:
        self.mode = int(mode)
        self.sets.append(self.mode)


def make_sync_op(switch: FakeSwitch):
    def sync_op() -> None:
        if switch.mode == 1:
            warnings.warn(SYNC_WARNING, UserWarning, stacklevel=2)
        elif switch.mode == 2:
            raise RuntimeError(SYNC_WARNING)

    return sync_op
