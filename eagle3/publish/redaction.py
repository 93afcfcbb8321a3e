"""Keep secrets and machine-local paths out of what gets published.

Two layers: `redact` rewrites the values that legitimately carry such things
(absolute paths in params and provenance, credentials in URLs) before
rendering; `find_leaks` then scans the rendered text for every secret this
machine knows about (DVC's config files, credential-like environment
variables) and for the project's and the user's directories, so a leak from
any field stops publication instead of shipping.
"""

import configparser
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from eagle3.errors import Eagle3Error
from eagle3.secret_filter import MIN_SECRET_LENGTH, environment_secrets

LOCAL = "<local>"
_ABSOLUTE = re.compile(r"^(/|~|[A-Za-z]:[\\/]|\\\\)")
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)
# DVC remote options that hold credentials (see `dvc remote modify` docs for s3, gs, azure, http, ssh, webdav...).
_CREDENTIAL_KEYS = re.compile(
    r"(password|passwd|secret|token|access_key_id|account_key|sas_token|connection_string|credential|client_secret)",
    re.IGNORECASE,
)


def redact(value: object, root: Path) -> Any:
    """A copy of a JSON-like value with absolute paths made relative to `root` or reduced to <local>/name,
    and URLs stripped of user info, query and fragment."""
    if isinstance(value, dict):
        return {key: redact(item, root) for key, item in value.items()}
    if isinstance(value, list):
        return [redact(item, root) for item in value]
    if isinstance(value, str):
        return redact_text(value, root)
    return value


def redact_text(text: str, root: Path) -> str:
    if _URL.match(text):
        return strip_url(text)
    if _ABSOLUTE.match(text):
        path = Path(os.path.expanduser(text))
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            return f"{LOCAL}/{path.name}" if path.name else LOCAL
    return text


def strip_url(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def dvc_remotes(root: Path) -> list[dict[str, Any]]:
    """The remotes shared in .dvc/config (config.local is this machine's own), credentials removed."""
    config = _read_dvc_config(root / ".dvc" / "config")
    default = config.get("core", "remote", fallback=None)
    remotes = []
    for section in config.sections():
        match = re.fullmatch(r"""'?remote\s+"([^"]+)"'?""", section.strip())
        if match and config.has_option(section, "url"):
            name = match.group(1)
            # redact_text: a URL without its credentials; a directory remote's absolute path as <local>/name.
            url = redact_text(config.get(section, "url"), root)
            remotes.append({"name": name, "url": url, "default": name == default})
    return sorted(remotes, key=lambda remote: remote["name"])


def known_secrets(root: Path) -> dict[str, str]:
    """{where it comes from: secret value} for every credential this machine holds for the project."""
    secrets: dict[str, str] = {}
    for name in ("config", "config.local"):
        path = root / ".dvc" / name
        config = _read_dvc_config(path)
        for section in config.sections():
            for key, value in config.items(section):
                where = f".dvc/{name} [{section}] {key}"
                if _CREDENTIAL_KEYS.search(key):
                    secrets[where] = value
                elif _URL.match(value):
                    parts = urlsplit(value)
                    if parts.password:
                        secrets[f"{where} (password in URL)"] = parts.password
                    if parts.username:
                        secrets[f"{where} (user in URL)"] = parts.username
    secrets.update(environment_secrets())
    return {where: value.strip() for where, value in secrets.items() if len(value.strip()) >= MIN_SECRET_LENGTH}


def find_leaks(text: str, root: Path) -> list[str]:
    """What in `text` must not be published: known secrets (by where they come from, never the value), the
    project's absolute path, the home directory."""
    leaks = [where for where, secret in known_secrets(root).items() if secret in text]
    for label, directory in (
        ("the project's absolute path", str(root.resolve())),
        ("the home directory", os.path.expanduser("~")),
    ):
        if directory not in ("", "/") and re.search(r"(?<![\w./-])" + re.escape(directory) + r"(?![\w.-])", text):
            leaks.append(label)
    return leaks


def check_publishable(outputs: dict[str, str], root: Path) -> None:
    for name, text in outputs.items():
        leaks = find_leaks(text, root)
        if leaks:
            raise Eagle3Error(
                f"{name}: would publish {', '.join(leaks)}; nothing was written (remove the value from params or "
                "inputs, "
                "or report it as a bug in eagle3/publish/redaction.py)"
            )


def _read_dvc_config(path: Path) -> configparser.ConfigParser:
    config = configparser.ConfigParser(interpolation=None, strict=False)
    if path.is_file():
        try:
            config.read_string(path.read_text(encoding="utf-8"), source=str(path))
        except configparser.Error as exc:
            raise Eagle3Error(f"{path}: cannot parse DVC config: {str(exc).splitlines()[0]}") from None
    return config
