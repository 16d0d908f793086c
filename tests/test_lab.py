"""`make lab`: the Makefile's JupyterLab command line starts a server that answers, root or not."""

import os
import secrets
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STARTUP_S = 90


def _lab_command() -> list[str]:
    """The Makefile's $(LAB), with the venv that runs these tests in place of .venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    out = subprocess.run(
        ["make", "-s", "--no-print-directory", "--eval", "print-lab: ; @echo $(LAB)",
         "print-lab", f"VENV={sys.prefix}"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True, timeout=30)
    return shlex.split(out.stdout.strip())


def test_lab_allows_root_exactly_when_root():
    cmd = _lab_command()
    assert cmd[:2] == [str(Path(sys.prefix) / "bin" / "jupyter"), "lab"]
    assert ("--allow-root" in cmd) == (os.getuid() == 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str) -> tuple[int, str]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # localhost, no proxy
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with opener.open(request, timeout=5) as response:
        return response.status, response.read().decode("utf-8", "replace")


def test_make_lab_command_starts_a_server_that_answers(tmp_path):
    pytest.importorskip("jupyterlab", reason="jupyterlab not installed: the [dev] extra installs "
                        "it (make test); the Colab lane's stack has no JupyterLab")
    (tmp_path / "notebooks").mkdir()  # the command's own argument, relative to its folder
    port, token = _free_port(), secrets.token_hex(16)
    cmd = _lab_command() + [
        "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}"]
    jupyter = {name: str(tmp_path / name) for name in ("config", "data", "runtime")}
    env = {**os.environ, "JUPYTER_CONFIG_DIR": jupyter["config"],
           "JUPYTER_DATA_DIR": jupyter["data"], "JUPYTER_RUNTIME_DIR": jupyter["runtime"]}
    log_path = tmp_path / "lab.log"
    base = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + STARTUP_S
        status = None
        while status is None:
            assert server.poll() is None, (
                f"`{shlex.join(cmd)}` exited with {server.returncode}:\n{log_path.read_text()}")
            assert time.monotonic() < deadline, (
                f"no answer within {STARTUP_S} s:\n{log_path.read_text()}")
            try:
                status = _get(f"{base}/api/status", token)
            except urllib.error.HTTPError:
                raise  # it answered, and said no
            except (urllib.error.URLError, ConnectionError, TimeoutError):  # not listening yet
                time.sleep(0.5)
        assert status[0] == 200 and '"started"' in status[1], status
        code, page = _get(f"{base}/lab", token)  # JupyterLab's page, not only the server
        assert code == 200 and "JupyterLab" in page, page[:500]
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=15)
