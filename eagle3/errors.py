"""The one exception type a user ever sees: a single line saying what, where and how to fix."""


class Eagle3Error(Exception):
    """Bad input or environment. The CLI prints it as one line and exits non-zero, with no traceback."""

    exit_code = 2
