"""`eagle3 server start|stop` (eagle3/servers.py) with a real process answering on 127.0.0.1: the runbook's step 3
stops a standing server that may not run, and a server not started by the tool is refused with the way out."""

import http.server
import threading

from conftest import eagle3


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (the handler's API)
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_stop_with_nothing_started_does_nothing_and_succeeds(tmp_path):
    result = eagle3(tmp_path, "server", "stop", "verifier")
    assert result.stderr.strip() == (
        f"• server verifier: none started here, nothing to stop ({tmp_path}/.eagle3/servers/verifier.pid is missing)"
    )


def test_a_server_started_another_way_is_named_with_the_way_out(tmp_path):
    standing = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=standing.serve_forever, daemon=True).start()
    try:
        port = standing.server_address[1]
        command = ["server", "start", "verifier", "--", "python", "-m", "http.server", "--port", str(port)]
        result = eagle3(tmp_path, *command, check=False)
    finally:
        standing.shutdown()
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        f"eagle3 server: error: server verifier: something already answers at http://127.0.0.1:{port}, not started "
        "by `eagle3 server start verifier`: stop it the way it was started (docs/hero-run.md, step 3), then rerun"
    )
