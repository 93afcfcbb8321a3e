"""Secrets never reach the terminal: one filter for every line the CLI prints, shared with the report's redaction.

`scrub` replaces with `***`: credentials in URLs (`scheme://user:password@host` -> `scheme://user:***@host`, an
http(s) URL's bare `user@`, often a token, and a key, token or signature in a query string or fragment), bearer
tokens (`Bearer <token>`: a misconfigured server may echo the request's header in its error body), the values of
environment variables whose names say they hold a secret (`..._TOKEN`, `..._KEY`, `PASSWORD`, ...) and every value
a stage read as a key (`register`: what an `api_key_env` names). Paths and everything else stay as they are: an
error line needs them. `guard_output` routes the process's stdout and stderr through it (eagle3/cli.py and
eagle3/runner.py call it first), so rich's progress lines, warnings, errors and libraries' logs are all filtered.
The report stage's redaction (eagle3/publish/redaction.py) reads the same secret environment variables.
"""

import os
import re
import sys
from collections.abc import Iterable
from typing import Any, TextIO

MASK = "***"
# Environment variable names that hold secrets by convention: a word of the name (GITHUB_TOKEN, AWS_SECRET_KEY,
# GITHUB_PAT) or a part of one that is never innocent (MY_APIKEY, HF_TOKENS, DB_PASSWORDFILE).
# (Not PWD or SESSION: the shell's working directory and a desktop session's bus are no secrets.)
SECRET_ENV_NAME = re.compile(r"(^|_)(KEY|PAT|AUTH|PASS)(_|$)|TOKEN|SECRET|PASSW|APIKEY|API_KEY|CREDENTIAL|PRIVATE_KEY")
# Shorter values are too likely to occur by chance (a key of "1" would mask every digit).
MIN_SECRET_LENGTH = 8
# user:password@ anywhere; a bare user@ only in http(s) URLs, where it is often a token (ssh://root@host is not).
_URL_PASSWORD = re.compile(r"(?P<start>\b[a-z][a-z0-9+.-]*://[^\s/@:'\"]*):[^\s/@'\"]+@", re.IGNORECASE)
_HTTP_USER = re.compile(r"(?P<start>\bhttps?://)[^\s/@:'\"]+@", re.IGNORECASE)
_BEARER = re.compile(r"(?P<word>\bBearer\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE)
# A credential in a URL's query string or fragment: ?api_key=..., &token=..., #access_token=..., &sig=...
_QUERY_SECRET = re.compile(
    r"(?P<start>[?&#;][^\s=&#'\"]*(?:key|token|secret|passw|auth|sig|signature|credential|session)[^\s=&#'\"]*=)"
    r"[^\s&#'\"]+",
    re.IGNORECASE,
)
_registered: set[str] = set()


def register(value: str | None) -> None:
    """A secret this process holds (an API key read from the environment): masked in everything it prints."""
    if value and len(value.strip()) >= MIN_SECRET_LENGTH:
        _registered.add(value.strip())


def environment_secrets() -> dict[str, str]:
    """{"environment variable NAME": value} for every variable whose name says it holds a secret."""
    return {
        f"environment variable {name}": value.strip()
        for name, value in os.environ.items()
        if SECRET_ENV_NAME.search(name.upper()) and len(value.strip()) >= MIN_SECRET_LENGTH
    }


def scrub(text: str) -> str:
    text = _URL_PASSWORD.sub(lambda m: f"{m['start']}:{MASK}@", text)
    text = _HTTP_USER.sub(lambda m: f"{m['start']}{MASK}@", text)
    text = _BEARER.sub(lambda m: f"{m['word']}{MASK}", text)
    text = _QUERY_SECRET.sub(lambda m: f"{m['start']}{MASK}", text)
    # Longest first, so a secret that contains another is masked whole.
    for secret in sorted({*_registered, *environment_secrets().values()}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


class _Scrubbed:
    """A text stream whose writes pass `scrub`; everything else is the wrapped stream's."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(scrub(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_output() -> None:
    """Filter this process's stdout and stderr (idempotent)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _Scrubbed):
            setattr(sys, name, _Scrubbed(stream))
