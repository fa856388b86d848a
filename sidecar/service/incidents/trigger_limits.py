"""How often a trigger may fire: a cooldown after each firing and a budget per rolling hour.

A sick server breaches its rules again and again; each firing costs it a capture (torch.profiler on
its step path) and a recorder dump. The limits bound that cost whatever the rule says; a breach they
refuse is told back with the reason (the triggers record it as ``skipped``), never dropped silently.
"""

from __future__ import annotations

from collections import deque

HOUR_S = 3600.0


class FiringLimits:
    def __init__(self, cooldown_s: float, budget_per_hour: int) -> None:
        if cooldown_s <= 0 or budget_per_hour < 1:
            raise ValueError("a cooldown > 0 and a budget >= 1 are required")
        self.cooldown_s = cooldown_s
        self.budget_per_hour = budget_per_hour
        self._fired: deque[float] = deque()  # times of the firings of the last hour (monotonic seconds)

    def refusal(self, now: float) -> str | None:
        """Why a firing at ``now`` may not happen (``cooldown``, ``budget``), or None: it may."""
        while self._fired and self._fired[0] <= now - HOUR_S:
            self._fired.popleft()
        if self._fired and now - self._fired[-1] < self.cooldown_s:
            return "cooldown"
        if len(self._fired) >= self.budget_per_hour:
            return "budget"
        return None

    def record(self, now: float) -> None:
        self._fired.append(now)

    def used(self, now: float) -> int:
        """Firings in the hour before ``now``."""
        return sum(1 for t in self._fired if t > now - HOUR_S)
