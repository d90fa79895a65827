"""What every case class of the state-store suite shares."""

from __future__ import annotations

from durably import StateStore


class StoreCases:
    """The hook a store's suite may answer: how many round trips the store has served.

    A few cases bound the round trips of one call (a batch claim is one statement). A store
    that keeps no such count answers None, and those cases check the results only."""

    def round_trips(self, store: StateStore) -> int | None:
        """How many round trips `store` has served so far; None (the default) when it keeps
        no count, and the round-trip bounds are not checked."""
        return None
