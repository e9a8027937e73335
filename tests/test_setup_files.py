"""The set-up files agree with each other, and `make lab` really serves JupyterLab."""
import json
import os
import signal
import socket
import subprocess
import time
import tomllib
import urllib.request
import uuid

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
