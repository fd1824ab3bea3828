"""One live `specdec serve` (the shipped demo pair, a test chat template) on 127.0.0.1 for the server tests."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "specdec" / "assets" / "demo_pair"
# A small chat template in the demo tokenizer's world (it was trained on Python code), with tools written
# Hermes-style (the `<tool_call>` family: tool_choice "auto" is parsed in that format).
# A user message "RAISE" makes it call raise_exception (its message must reach the client).
CHAT_TEMPLATE = ("{% if tools %}# tools:\n{% for t in tools %}# {{ t['function'] | tojson }}\n{% endfor %}"
                 "# answer with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>\n{% endif %}"
                 "{% for m in messages %}{% if m['content'] == 'RAISE' %}{{ raise_exception('no RAISE please') }}{% endif %}"
                 "# {{ m['role'] }}: {{ m['content'] }}{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>"
                 "{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}</tool_call>"
                 "{% endfor %}{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}def{% endif %}")
GAMMA = 4
MODEL = (("model_name", "demo"),)  # the label every metric carries


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def chat_template_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("serve") / "chat.jinja"
    path.write_text(CHAT_TEMPLATE, encoding="utf-8")
    return path


def serve_command(port: int, chat_template_file: Path, *extra: str) -> list[str]:
    """`specdec serve` on the demo pair with the tests' chat template, γ and name, plus `extra` options."""
    return [sys.executable, "-m", "specdec", "serve", "--target", str(DEMO / "target"), "--draft", str(DEMO / "draft"),
            "--port", str(port), "--num-draft-tokens", str(GAMMA), "--chat-template", str(chat_template_file),
            "--served-model-name", "demo", "--max-batch-size", "16", *extra]


@contextlib.contextmanager
def live_server(chat_template_file: Path, log_name: str, *extra: str, while_loading=None):
    """Base URL of a `specdec serve` subprocess (`serve_command` + `extra`), stopped on exit; its log (`log_name`,
    beside the chat template) is printed if it fails to start. while_loading: called while the subprocess loads."""
    port, log = _free_port(), chat_template_file.parent / log_name
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(log, "w") as out:
        proc = subprocess.Popen(serve_command(port, chat_template_file, *extra), stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        if while_loading is not None:
            while_loading()
        deadline = time.time() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"specdec serve exited with {proc.returncode}:\n{log.read_text()}")
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                pytest.fail(f"specdec serve did not start:\n{log.read_text()}")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def server(chat_template_file):
    """Base URL of a `specdec serve` subprocess; its log is printed if it fails to start.

    While the subprocess loads, this process loads the same pair for `local_llm` (two cores, both busy).
    """
    try:
        load = lambda: _LOCAL.append(_load_local(chat_template_file))  # noqa: E731
        with live_server(chat_template_file, "serve.log", while_loading=load) as base:
            yield base
    finally:
        for llm in _LOCAL:
            llm.close()


_LOCAL: list = []


def _load_local(chat_template_file):
    import specdec

    return specdec.load(DEMO / "target", draft=DEMO / "draft", num_draft_tokens=GAMMA, max_batch_size=4,
                        chat_template=str(chat_template_file))


@pytest.fixture(scope="session")
def server_log(server, chat_template_file) -> Path:
    """The live server's stdout and stderr, as written so far."""
    return chat_template_file.parent / "serve.log"


@pytest.fixture(scope="session")
def local_llm(server):
    """The same pair through the Python text API, in this process."""
    return _LOCAL[0]


def metric_values(base: str) -> dict:
    """{(sample name, labels tuple): value} of /metrics, parsed with prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(base + "/metrics", timeout=10).text
    values = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return values


def wait_idle(base: str, timeout: float = 10.0) -> dict:
    deadline = time.time() + timeout
    while True:
        values = metric_values(base)
        if values[("specdec:num_requests_running", MODEL)] == 0 and values[("specdec:num_requests_waiting", MODEL)] == 0:
            return values
        if time.time() > deadline:
            raise AssertionError(f"server still busy: {values}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def start_server(chat_template_file):
    """`live_server` with the tests' chat template: `with start_server("name.log", *options) as base: ...`."""
    return lambda log_name, *extra: live_server(chat_template_file, log_name, *extra)


@pytest.fixture(scope="session")
def metrics_of():
    """`metric_values` of any live server's base URL."""
    return metric_values


@pytest.fixture(scope="session")
def read_metrics(server):
    return lambda: metric_values(server)


@pytest.fixture(scope="session")
def idle(server):
    """Call to wait until the server has no running or waiting request; returns the metrics then."""
    return lambda timeout=10.0: wait_idle(server, timeout)
