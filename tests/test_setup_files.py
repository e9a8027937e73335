"""The set-up files agree with each other, and `make lab` really serves JupyterLab."""
import asyncio
import json
import os
import signal
import socket
import subprocess
import time
import tomllib
import urllib.request
import uuid

import pytest
import yaml

from conftest import REPO


def test_environment_yml_pins_what_pyproject_pins():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"]) | set(project["optional-dependencies"]["dev"])
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    assert "python=3.11" in env["dependencies"] and "pip" in env["dependencies"]
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    normalise = lambda specs: {s.replace(" ", "") for s in specs}  # noqa: E731
    assert normalise(pip_section) == normalise(wanted)
    assert "torch==2.13.0" in wanted  # the tested CPU build; an unpinned torch pulls a multi-GB CUDA build


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_lab_serves_the_learners_workspace_on_the_start_notebook(tmp_path):
    port, token = free_port(), uuid.uuid4().hex
    flags = f"--no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token={token} --ServerApp.open_browser=False"
    workspace = tmp_path / "workspace"  # not the clone's own workspace/: a test must not create a learner's files
    lab = subprocess.Popen(["make", "--no-print-directory", "lab", f"LAB_FLAGS={flags}", f"WORKSPACE={workspace}"],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, body, status = time.time() + 120, "", None
        while time.time() < deadline and status != 200:
            try:
                url = f"http://127.0.0.1:{port}/?token={token}"  # follows the redirect to the start notebook
                with urllib.request.urlopen(url, timeout=5) as response:
                    status, body = response.status, response.read().decode()
            except OSError:
                assert lab.poll() is None, lab.stdout.read().decode()
                time.sleep(1)
        assert status == 200 and "JupyterLab" in body
        assert response.url.split("?")[0].endswith("/lab/tree/notebooks/00_start_here.ipynb")
        api = f"http://127.0.0.1:{port}/api/contents/notebooks/00_start_here.ipynb?token={token}&content=0"
        with urllib.request.urlopen(api, timeout=10) as response:
            assert b'"type": "notebook"' in response.read().replace(b'"type":"notebook"', b'"type": "notebook"')
        assert (workspace / "notebooks" / "00_start_here.ipynb").is_file()  # served from the copy, not the clone
        settings = f"http://127.0.0.1:{port}/lab/api/settings/@jupyterlab/apputils-extension:notification?token={token}"
        with urllib.request.urlopen(settings, timeout=10) as response:
            defaults = {k: v.get("default") for k, v in json.loads(response.read())["schema"]["properties"].items()}
        assert defaults["fetchNews"] == "false" and defaults["checkForUpdates"] is False  # no news pop-up
        # A terminal opened in the lab finds the course's command, as notebooks 00 and 16 say it will.
        found = asyncio.run(_in_lab_terminal(port, token, "command -v partrain-edu"))
        assert str(REPO / ".venv" / "bin" / "partrain-edu") in found, found
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(lab.pid, sig)  # make and the jupyter server it started
                lab.wait(timeout=20)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue


async def _in_lab_terminal(port: int, token: str, command: str) -> str:
    """What a JupyterLab terminal (File → New → Terminal: the terminals REST API and its websocket) prints for
    `command`, up to the marker echoed after it."""
    from tornado.websocket import websocket_connect

    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/terminals?token={token}", method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        name = json.loads(response.read())["name"]
    ws = await websocket_connect(f"ws://127.0.0.1:{port}/terminals/websocket/{name}?token={token}")
    ws.write_message(json.dumps(["stdin", f'{command}; echo END-OF-""TEST\r']))  # the echoed line has no marker
    seen, deadline = "", time.time() + 30
    while "END-OF-TEST" not in seen and time.time() < deadline:
        message = await asyncio.wait_for(ws.read_message(), timeout=30)
        kind, *rest = json.loads(message)
        seen += rest[0] if kind == "stdout" else ""
    ws.close()
    return seen


def _stub(path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def test_make_install_says_each_phase_and_where_pips_log_is(tmp_path):
    """A fresh `make install` into another folder, with a stand-in Python that records what it is asked: one
    line per phase (venv, pip with its log, the import check, done), pip's own output only in the log."""
    calls, venv = tmp_path / "calls", tmp_path / "venv"
    fake = f'echo "python $*" >> {calls}\n'
    _stub(tmp_path / "python3", fake + 'if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; '
                                       'fi\nif [ "$1 $2" = "-m pip" ]; then echo "pip chatter"; fi\n')
    done = subprocess.run(["make", "--no-print-directory", "install", f"VENV={venv}", f"PYTHON={tmp_path / 'python3'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines if not line.startswith(" ")] == ["install"] * 4, lines
    assert f"creating the virtual environment {venv}/" in lines[0]
    assert "installing PyTorch 2.13.0" in lines[1] and f"pip's log: {venv}/pip.log" in done.stdout
    assert "checking that torch 2.13.0 and partrain_edu import" in done.stdout and "done" in lines[-1]
    assert "pip chatter" not in done.stdout and "pip chatter" in (venv / "pip.log").read_text()
    asked = calls.read_text().splitlines()
    assert asked[0] == f"python -m venv {venv}" and asked[1].startswith("python -m pip install")
    assert (venv / ".partrain-installed").exists()
    again = subprocess.run(["make", "--no-print-directory", "install", f"VENV={venv}"], cwd=REPO, capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 0 and "install:" not in again.stdout  # up to date: nothing to do, nothing said


def test_make_browser_installs_chromium_and_a_cjk_font_only_when_missing(tmp_path):
    """`make browser` asks apt for fonts-noto-cjk only when `fc-list :lang=zh` lists no font, and for nothing
    (no network) when Chromium and the font are both there. apt, sudo and fc-list are stand-ins here."""
    if not os.path.exists("/usr/bin/chromium"):
        pytest.skip("the stand-ins cover the font; /usr/bin/chromium itself is tested in place")
    calls = tmp_path / "calls"
    _stub(tmp_path / "apt-get", f'echo "apt-get $*" >> {calls}\n')
    _stub(tmp_path / "sudo", f'echo "sudo" >> {calls}\nexec "$@"\n')
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    for fonts, wanted in (("/usr/share/fonts/x.ttc: Noto Sans CJK SC:style=Regular\n", []),
                          ("", ["apt-get update -qq", "apt-get install -y -qq fonts-noto-cjk"])):
        _stub(tmp_path / "fc-list", f"printf '{fonts}'\n")
        calls.write_text("")
        done = subprocess.run(["make", "--no-print-directory", "browser"], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert [c for c in calls.read_text().splitlines() if c != "sudo"] == wanted
        assert ("installing fonts-noto-cjk with apt" in done.stdout) == bool(wanted), done.stdout


def test_make_install_torch_cpu_takes_pytorchs_cpu_index_and_says_the_sizes(tmp_path):
    """`TORCH=cpu` installs torch from PyTorch's CPU index first (as pytorch.org's selector says), then the course;
    without it, on Linux x86-64, the first line warns of PyPI's 2.9 GB CUDA build and names the CPU route."""
    calls = tmp_path / "calls"
    _stub(tmp_path / "python3", f'echo "python $*" >> {calls}\n'
          'if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; fi\n')
    for torch_flag in ("TORCH=cpu", "TORCH="):
        venv = tmp_path / f"venv-{torch_flag[6:] or 'default'}"
        calls.write_text("")
        done = subprocess.run(["make", "--no-print-directory", "install", f"VENV={venv}",
                               f"PYTHON={tmp_path / 'python3'}", torch_flag],
                              cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        pips = [line for line in calls.read_text().splitlines() if " -m pip " in line]
        if torch_flag == "TORCH=cpu":
            assert "about 380 MB to fetch with PyTorch's CPU build" in done.stdout
            assert pips[0].split() == ["python", "-m", "pip", "install", "--disable-pip-version-check",
                                       "torch==2.13.0", "--index-url", "https://download.pytorch.org/whl/cpu"]
            assert pips[1].endswith("-e .[dev]") and len(pips) == 2
        else:
            assert len(pips) == 1 and pips[0].endswith("-e .[dev]")
            if os.uname().sysname == "Linux" and os.uname().machine == "x86_64":
                assert "about 2.9 GB to fetch: PyPI's PyTorch for Linux is the CUDA build" in done.stdout
                assert "install TORCH=cpu for about 380 MB" in done.stdout


def test_the_courses_kernels_know_its_magics_after_a_restart_and_load_ext_stays_silent():
    """`make install` puts jupyter_config/ipython_kernel_config.py where this venv's kernels read it: a fresh
    kernel (as after Kernel → Restart) runs `%dist` at once, and a notebook's own `%load_ext` prints nothing."""
    from jupyter_client.manager import start_new_kernel

    installed = REPO / ".venv" / "etc" / "ipython" / "ipython_kernel_config.py"
    assert installed.read_text() == (REPO / "jupyter_config" / "ipython_kernel_config.py").read_text()
    km, kc = start_new_kernel(kernel_name="python3")
    said = []

    def hook(msg):
        if msg["msg_type"] in ("stream", "error"):
            said.append(msg["content"].get("text") or f"{msg['content']['ename']}: {msg['content']['evalue']}")
    try:
        kc.execute_interactive("%dist status", output_hook=hook, timeout=60)
        assert said == ["no warm ranks: `%dist start -n N` starts them\n"], said
        kc.execute_interactive("%load_ext partrain_edu", output_hook=hook, timeout=60)
        assert len(said) == 1, said
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
