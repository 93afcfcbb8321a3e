"""Secrets never reach the terminal or a file: URL credentials, bearer tokens, keys from the environment."""

import subprocess
import sys

from eagle3 import secret_filter
from eagle3.secret_filter import MASK, scrub

from conftest import eagle3, smoke_params, write_params
from fake_openai import FakeServer
from test_generate import _params, project

KEY = "sk-live-7f3a9c2e51d84b6f"


def test_scrub_masks_url_credentials_bearer_tokens_and_known_keys(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-0123456789abcdef")
    monkeypatch.setenv("OTHER_SETTING", "not-a-secret-value")
    secret_filter.register("registered-key-ABCDEFGH")
    text = (
        "http://alice:pa55word@host:8000/v1 said 401 {'auth': 'Bearer abc.DEF-123_xyz'}; tok-0123456789abcdef; "
        "registered-key-ABCDEFGH; /home/alice/project/data/x.e3sh; not-a-secret-value"
    )
    assert scrub(text) == (
        f"http://alice:{MASK}@host:8000/v1 said 401 {{'auth': 'Bearer {MASK}'}}; {MASK}; {MASK}; "
        "/home/alice/project/data/x.e3sh; not-a-secret-value"
    )
    assert scrub("a short key 1 stays: 1") == "a short key 1 stays: 1"  # too short to mask by value
    # A token as an http(s) URL's user is masked; an ssh user name is not a secret.
    assert scrub("https://ghp_abcdef0123456789@github.com/x and ssh://root@10.0.0.5/srv") == (
        f"https://{MASK}@github.com/x and ssh://root@10.0.0.5/srv"
    )
    assert scrub("ssh://deploy:s3cret-pass@10.0.0.5/srv") == f"ssh://deploy:{MASK}@10.0.0.5/srv"
    # Keys, tokens and signatures in a query string or fragment; the other parameters stay.
    assert scrub(
        "http://host:9/v1?api_key=sk-abc123&top=5 https://h/cb#access_token=xyz789 s3://b/o?X-Amz-Signature=d3ad"
    ) == (f"http://host:9/v1?api_key={MASK}&top=5 https://h/cb#access_token={MASK} s3://b/o?X-Amz-Signature={MASK}")


def test_variables_named_as_secrets_in_other_spellings_are_masked(monkeypatch):
    monkeypatch.setenv("GITHUB_PAT", "github_pat_0123456789")
    monkeypatch.setenv("MY_APIKEY", "apikey-0123456789")
    monkeypatch.setenv("HF_TOKENS", "hf_tokens-0123456789")
    monkeypatch.setenv("KEYBOARD_LAYOUT", "us-international")  # a KEY that is not a key
    assert scrub("github_pat_0123456789 apikey-0123456789 hf_tokens-0123456789 us-international") == (
        f"{MASK} {MASK} {MASK} us-international"
    )


def _everything_written(root) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in root.rglob("*") if p.is_file())


def test_params_holding_secrets_are_refused_without_repeating_them(tmp_path):
    for openai, secret in (
        ({"base_urls": ["http://alice:hunter2-secret@127.0.0.1:9/v1"], "model": "m"}, "hunter2-secret"),
        ({"base_urls": ["http://127.0.0.1:9/v1"], "model": "m", "api_key_env": KEY}, KEY),
        ({"base_urls": ["http://127.0.0.1:9/v1?api_key=qs-0123456789abcdef"], "model": "m"}, "qs-0123456789abcdef"),
        ({"base_urls": ["http://127.0.0.1:9/v1#token=fr-0123456789abcdef"], "model": "m"}, "fr-0123456789abcdef"),
    ):
        params = smoke_params()
        params["generate"] = {**params["generate"], "backend": "openai", "openai": openai}
        write_params(tmp_path, params)
        result = eagle3(tmp_path, "generate", check=False)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert secret not in result.stdout + result.stderr
        assert "openai" in result.stderr and "Traceback" not in result.stderr


def test_a_server_echoing_the_key_in_its_401_never_shows_it(verifier_project, tmp_path):
    """The key from the environment, sent as a bearer header and echoed back by the server's error body, appears
    in nothing the CLI prints or writes."""

    def echo(body):
        return 401, {"error": f"invalid api key {KEY}", "received": {"Authorization": f"Bearer {KEY}"}}

    with FakeServer(echo) as server:
        openai = {"base_urls": [server.url], "model": "verifier", "api_key_env": "EAGLE3_TEST_SERVER", "max_retries": 0}
        root = project(tmp_path, verifier_project, _params({"backend": "openai", "openai": openai}))
        result = eagle3(root, "generate", env={"EAGLE3_TEST_SERVER": KEY}, check=False)
    assert result.returncode == 2, result.stderr
    assert "rejected the request: HTTP 401" in result.stderr and MASK in result.stderr
    assert KEY not in result.stdout + result.stderr
    assert KEY not in _everything_written(root)


def test_guard_output_filters_what_libraries_print(monkeypatch):
    script = (
        "import logging, sys; from eagle3.secret_filter import guard_output; guard_output(); "
        "logging.basicConfig(stream=sys.stderr); logging.getLogger('lib').warning('token %s', 'Bearer s3cr3t.value'); "
        "print('url http://u:p4ssw0rd@h/v1')"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "s3cr3t" not in result.stderr and "p4ssw0rd" not in result.stdout
    assert f"Bearer {MASK}" in result.stderr and f"http://u:{MASK}@h/v1" in result.stdout
