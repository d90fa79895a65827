"""`Engine(concurrency=…)`: the value a program declares — a whole number, "adaptive" or an
`AdaptiveConcurrency` — and its check. The limiter that enforces it at run time is
`durably._engine.flow.step_limits` (its docstring says how each kind behaves)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from durably._core.durations import Duration, to_ms
from durably._core.log_context import durably_logger

log = durably_logger("durably.engine")

__all__ = ["AdaptiveConcurrency", "ConcurrencySpec", "check_concurrency"]

Reason = Literal["ram_ceiling", "cpu_ceiling", "backpressure", "grow", "shrink"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AdaptiveConcurrency:
    """The knobs of adaptive worker concurrency (module docstring); every value is checked
    when it is built (`ValueError` naming it)."""

    min: int = 1
    max: int = 32
    start: int | None = None
    """The limit to start at (default `min`)."""
    tick: Duration = 2.0
    """How often the limit is adjusted (seconds, a timedelta or a string such as "2s")."""
    ram_ceiling_pct: float = 85.0
    ram_admit_pct: float = 75.0
    ram_resume_pct: float = 65.0
    cpu_ceiling_pct: float = 90.0
    latency_tolerance: float = 1.5
    decrease: float = 0.75
    """The factor a shrink multiplies the limit by (a RAM ceiling halves it)."""
    tick_ms: int = field(init=False, default=0, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("min", "max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"AdaptiveConcurrency({name}=…) must be a whole number >= 1")
        if self.max < self.min:
            raise ValueError(f"AdaptiveConcurrency(max={self.max}) is below min={self.min}")
        if self.start is not None and (
            isinstance(self.start, bool)
            or not isinstance(self.start, int)
            or not self.min <= self.start <= self.max
        ):
            raise ValueError(
                f"AdaptiveConcurrency(start={self.start!r}) must be a whole number from min "
                f"({self.min}) to max ({self.max})"
            )
        try:
            tick_ms = to_ms(self.tick)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"AdaptiveConcurrency(tick=…): {exc}") from None
        if tick_ms < 10:
            raise ValueError("AdaptiveConcurrency(tick=…) must be at least 10 ms")
        object.__setattr__(self, "tick_ms", tick_ms)
        for name in ("ram_ceiling_pct", "ram_admit_pct", "ram_resume_pct", "cpu_ceiling_pct"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (0 < value <= 100)
            ):
                raise ValueError(f"AdaptiveConcurrency({name}=…) must be a percentage in (0, 100]")
        if not self.ram_resume_pct <= self.ram_admit_pct <= self.ram_ceiling_pct:
            raise ValueError(
                "AdaptiveConcurrency: ram_resume_pct <= ram_admit_pct <= ram_ceiling_pct, "
                f"got {self.ram_resume_pct}, {self.ram_admit_pct}, {self.ram_ceiling_pct}"
            )
        if not isinstance(self.latency_tolerance, int | float) or self.latency_tolerance <= 1:
            raise ValueError("AdaptiveConcurrency(latency_tolerance=…) must be above 1")
        if not isinstance(self.decrease, int | float) or not 0 < self.decrease < 1:
            raise ValueError("AdaptiveConcurrency(decrease=…) must be between 0 and 1")


#: `Engine(concurrency=...)`: None (no limit of its own), a fixed whole number, "adaptive"
#: (the default knobs) or an `AdaptiveConcurrency`.
ConcurrencySpec = int | Literal["adaptive"] | AdaptiveConcurrency | None


def check_concurrency(owner: str, value: object) -> None:
    """Raise `ValueError` naming `owner(concurrency=…)` unless `value` is a valid spec."""
    if value is None or value == "adaptive" or isinstance(value, AdaptiveConcurrency):
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f'{owner}(concurrency=…) must be a whole number >= 1, "adaptive" or an '
            f"AdaptiveConcurrency, not {value!r}"
        )
