"""The one exception type a user ever sees: a single line saying what, where and how to fix."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


class Eagle3Error(Exception):
    """Bad input or environment. The CLI prints it as one line and exits non-zero, with no traceback."""

    exit_code = 2


def field_problem(exc: "ValidationError") -> str:
    """A pydantic ValidationError's first complaint on one line: `field.path: what is wrong (got value)`, the
    value shortened (and, as a repr, with no raw newline), for errors about files a user did not write."""
    error = exc.errors()[0]
    field = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"]).lstrip(".")
    shown = repr(error.get("input"))
    got = "" if error["type"] in ("missing", "json_invalid") else f" (got {shown[:60]}{'...' * (len(shown) > 60)})"
    return f"{field}: {error['msg']}{got}" if field else error["msg"]
