"""When rank 0 lets the viewer poll and render (docs/design.md: the viewer renders between
steps without slowing training much).

Other ranks cannot see rank 0's clock, so rank 0 turns time into steps: each poll message
carries the number of steps until the next poll, and every rank compares an int with the
step counter in between (no host sync, no collective). Rank 0 picks that interval so that
  * viewer frames take at most `budget` of the wall time (a frame that took r seconds
    allows the next one r * (1 - budget) / budget seconds later) and at most `max_fps`;
  * a poll still happens every `max_wait_s` (pause clicks and panel updates stay live).
Pure bookkeeping on the host; the caller passes the clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Pacer:
    budget: float = 0.03  # fraction of wall time viewer frames may take while training
    max_fps: float = 20.0
    max_wait_s: float = 1.0  # longest time between polls (pause clicks take effect within it)

    def __post_init__(self) -> None:
        if not (0.0 < self.budget < 1.0):
            raise ValueError(f"viewer budget must be in (0, 1), got {self.budget}")
        self.step_s = 0.0  # seconds per training step (viewer time excluded), an EMA
        self.steps_per_s = 0.0  # what the panel shows: steps / wall time, viewer included
        self.frame_s = 0.0  # seconds of the last frame
        self.next_frame_at = -math.inf  # while training: the budget's next frame
        self.last_frame_end = -math.inf
        self.last_poll = -math.inf
        self._last: tuple[float, int] | None = None  # (time, step) at the end of the last poll
        self._viewer_s = 0.0  # viewer time since then

    def frame_allowed(self, now: float, training: bool) -> bool:
        """Training: the budget decides; paused or serving: only max_fps does."""
        if training:
            return now >= self.next_frame_at
        return now >= self.last_frame_end + 1.0 / self.max_fps

    def observe_steps(self, now: float, step: int) -> None:
        """At a poll: the steps since the last poll tell how long a step takes."""
        if self._last is not None and step > self._last[1]:
            t0, s0 = self._last
            n = step - s0
            train_s = max(now - t0 - self._viewer_s, 1e-6) / n
            wall_s = max(now - t0, 1e-6) / n
            a = 0.3 if self.step_s else 1.0
            self.step_s = (1 - a) * self.step_s + a * train_s
            self.steps_per_s = (1 - a) * self.steps_per_s + a / wall_s if self.steps_per_s else 1 / wall_s
            self._viewer_s = 0.0
        self._last = (now, step)

    def frame_done(self, start: float, end: float, training: bool) -> None:
        self.frame_s, self.last_frame_end = end - start, end
        gap = self.frame_s * (1 - self.budget) / self.budget if training else 0.0
        self.next_frame_at = end + max(gap, 1.0 / self.max_fps)

    def add_viewer_time(self, seconds: float) -> None:
        self._viewer_s += seconds

    def interval(self, now: float, want_frames: bool) -> int:
        """Steps until the next poll, >= 1: when the next frame is allowed if a browser
        is connected, and after max_wait_s at the latest."""
        target = now + self.max_wait_s
        if want_frames:
            target = min(target, max(self.next_frame_at, now))
        if self.step_s <= 0.0:
            return 1  # no step measured yet
        return max(1, math.ceil((target - now) / self.step_s))
