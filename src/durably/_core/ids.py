"""The one rule every run id obeys, on every store.

A run id is a non-empty `str` of printable characters (no control characters, NUL included,
and no Unicode separators or format characters other than the ASCII space) of at most
`MAX_RUN_ID_BYTES` bytes once encoded as UTF-8.

Why these limits: the in-memory store would take any string, but SQLite keeps a NUL in TEXT
while PostgreSQL refuses it with a raw driver error, and a very long id fails PostgreSQL's
index size limit — so the same start would succeed on one store and fail on another. The
engine checks ids itself, before any store call, so every store sees the same ids and a bad
one is refused with an `InvalidRunIdError` naming the broken rule. Invisible and line-breaking
characters are refused too: an id is shown in logs, the console and shell commands, where such
characters would make two different ids look alike.

The engine derives ids from a run id (children `<id>.child.<n>`, fan members
`<id>.all.<n>.<i>`, onError handlers, retries `<id>~retry~<hex>`, continuations `<id>~<n>`).
A derived id obeys the same rule: one that would be too long is refused like a given one, as a
clear failure of that start, never written. So an id that gets children or retries should
leave room for the suffix.
"""

from __future__ import annotations

from durably._core.errors import InvalidRunIdError

MAX_RUN_ID_BYTES = 255
_SHOWN_CHARS = 60  # characters of a refused id quoted in the error


def safe_repr(run_id: str) -> str:
    """A quotable form of an id: escapes every non-printable character (`repr` does) and
    shortens a long id so an error message stays readable."""
    if len(run_id) <= _SHOWN_CHARS:
        return repr(run_id)
    # Head and tail: a derived id differs from its parent's at the end (`.child.3`).
    return f"{run_id[: _SHOWN_CHARS - 20]!r}…{run_id[-16:]!r}"


def validate_run_id(run_id: object, *, what: str = "run id") -> str:
    """`run_id` itself when it obeys the rule (module docstring), else `InvalidRunIdError`.

    `what` names the id in the message (`"child run id"`, `"new run id"`, …)."""
    if not isinstance(run_id, str):
        raise InvalidRunIdError(
            run_id,
            "not_a_string",
            f"invalid {what}: expected a str, got {type(run_id).__name__} {run_id!r:.80}",
        )
    if not run_id:
        raise InvalidRunIdError(
            run_id,
            "empty",
            f"invalid {what} '': a run id must not be empty (pass None, or leave it out, to "
            "get a generated id)",
        )
    if not run_id.isprintable():
        index, char = next((i, c) for i, c in enumerate(run_id) if not c.isprintable())
        raise InvalidRunIdError(
            run_id,
            "not_printable",
            f"invalid {what} {safe_repr(run_id)}: run ids must be printable, but character "
            f"{index} is U+{ord(char):04X} (control characters, NUL included, line breaks, "
            "invisible and separator characters other than the space are not allowed)",
        )
    size = len(run_id.encode("utf-8"))
    if size > MAX_RUN_ID_BYTES:
        raise InvalidRunIdError(
            run_id,
            "too_long",
            f"invalid {what} {safe_repr(run_id)}: it is {size} bytes of UTF-8, run ids are at "
            f"most {MAX_RUN_ID_BYTES} (ids the engine derives from a run id — children, fan "
            "members, retries, continuations — add a suffix to it, so leave room for one)",
        )
    return run_id


def given_run_id(run_id: str | None, *, what: str = "run id") -> str | None:
    """An optional id as a caller gave it: None (the engine makes one up) or a valid id.

    An empty string is refused rather than treated like None: a caller who passes `""` most
    likely meant an id (an unset variable, a missing form field), and a run under a random
    id would not be found again by the id they have."""
    return None if run_id is None else validate_run_id(run_id, what=what)


__all__ = ["MAX_RUN_ID_BYTES", "given_run_id", "safe_repr", "validate_run_id"]
