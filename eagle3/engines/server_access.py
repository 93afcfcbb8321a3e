"""What every client of an OpenAI-compatible vLLM server needs, whichever stage it serves (generate's answers,
evaluate's measurements): the API key header, and the server's vLLM version for the environment record."""

import ipaddress
import os
from urllib.parse import urlparse

import httpx

from eagle3.errors import Eagle3Error
from eagle3.secret_filter import register


def auth_headers(api_key_env: str | None, setting: str) -> dict[str, str]:
    """The bearer header from the environment variable `api_key_env` names (the key never goes in params.yaml);
    `setting` is the params key that names it, for the error."""
    if not api_key_env:
        return {}
    key = os.environ.get(api_key_env)
    if not key:
        raise Eagle3Error(f"{setting}: environment variable {api_key_env} is not set")
    register(key)
    return {"Authorization": f"Bearer {key}"}


def vllm_version(root: str, headers: dict[str, str]) -> str:
    """GET {root}/version of a vLLM server; "unknown" where it does not answer (a proxy, another server)."""
    try:
        response = httpx.get(f"{root}/version", headers=headers, timeout=10)
        return str(response.json()["version"]) if response.status_code == 200 else "unknown"
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return "unknown"


def is_loopback(url: str) -> bool:
    """Whether `url` names this machine (localhost or a loopback address): a server reached there runs here."""
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
