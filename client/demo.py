"""``spar demo``: the main job end to end, on the embedded default, with nothing configured.

It starts ``spar dev`` (embedded PostgreSQL, in-memory broker) unless one already answers
on the port, makes a demo user and
organization (kept in ``<data-dir>/demo.json`` for the next time), serves a small
rule-based support agent on loopback — with a deliberate flaw: it approves every refund,
even outside the 30-day policy — registers it, pushes the built-in demo suite
(``client/demo_suite/``: deterministic criteria, no LLM needed), runs it as a batch with
the progress bar, prints the results, the link to the results page and the token to
sign in there with, and keeps Spar running until Ctrl-C (``--exit`` stops at once).

The browser is not signed in for you: the results page signs in with a pasted token, and
a token in a URL would be kept in the browser's history and the server's logs.  So every
run, whether it started Spar or found one running, prints the sign-in page and the demo
user's token (a session token, as ``POST /v1/auth/login`` gives).
"""

from __future__ import annotations

import json
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import click
import httpx
from rich.console import Console

from client.api import Api, Target, UsageProblem
from client.batch import EXIT_FAILED, run_batch
from client.extras import require
from client.scenarios import apply, load_dir
from client.terminal import make_console, say

# spar dev's default (shared.db.embedded.DEFAULT_DATA_DIR, which needs spar[dev]), shared
DEV_DATA_DIR = Path(".spar-dev")
SUITE = Path(__file__).with_name("demo_suite")
AGENT_NAME = "demo-support"
START_TIMEOUT_S = 180.0
LLM_HINT = (
    "LLM-judged criteria (criteria_type llm_evaluated) need a judge: spar hosts allow "
    "api.openai.com, then spar providers add openai --provider openai --model gpt-4o-mini "
    "--api-key-env OPENAI_API_KEY --judge (docs/cli.md)."
)


# --- the demo agent: protocol `spar`, rules, one deliberate flaw ------------------------------


def demo_reply(turn: dict[str, Any]) -> str:
    """A support agent for a small shop, by rules.  The flaw the demo suite catches: it
    approves every refund without checking the 30-day policy."""
    message = turn["message"]
    lowered = message.lower()
    name = (turn.get("customer_context") or {}).get("name")
    if "human" in lowered or "person" in lowered:
        return "Of course, I am handing you over to a colleague now."
    if "thank" in lowered:
        return "You're welcome! Anything else I can do?"
    if "refund" in lowered:
        return "Your refund is approved and has been started: 3 to 5 business days."
    if "arrive" in lowered:
        return "It should arrive within 2 to 4 business days."
    order = re.search(r"\b[A-Z]-\d+\b", message)
    if order:
        return f"Order {order.group(0)} has shipped and is on its way."
    if name:
        return f"Hello {name}! How can I help you today?"
    return "I can help with orders, refunds, or hand you over to a colleague."


class _DemoAgent(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        turn = json.loads(self.rfile.read(length) or b"{}")
        body = json.dumps({"content": demo_reply(turn)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return  # quiet: the demo prints its own progress


@contextmanager
def demo_agent() -> Iterator[str]:
    """The demo agent on a free loopback port; its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _DemoAgent)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/chat"
    finally:
        server.shutdown()
        server.server_close()


# --- Spar itself: spar dev in a child process ----------------------------------------------------


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health/live", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def spar_dev(data_dir: Path, port: int, console: Console) -> Iterator[str]:
    """``spar dev`` on ``port`` until the block ends; its URL once it answers.  A Spar
    already answering there (a ``spar dev`` in another terminal) is used as it is."""
    url = f"http://127.0.0.1:{port}"
    if _answers(url):
        say(console, f"using the Spar already running at {url}")
        yield url
        return
    require("dev", "spar demo (it starts spar dev)")
    data_dir.mkdir(parents=True, exist_ok=True)
    log = (data_dir / "demo-server.log").open("ab")
    argv = [sys.executable, "-m", "client", "dev", "--data-dir", str(data_dir)]
    process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
        [*argv, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        with console.status(f"starting Spar (embedded PostgreSQL in {data_dir})…"):
            deadline = time.monotonic() + START_TIMEOUT_S
            while not _answers(url):
                if process.poll() is not None:
                    raise UsageProblem(f"spar dev stopped; see {data_dir / 'demo-server.log'}")
                if time.monotonic() > deadline:
                    raise UsageProblem(f"spar dev did not answer within {START_TIMEOUT_S:.0f} s")
                time.sleep(0.3)
        yield url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
        log.close()


# --- the demo organization ----------------------------------------------------------------------


def _sign_in(url: str, data_dir: Path) -> Target:
    """The demo user's token and organization: made on the first run, kept in demo.json."""
    kept = data_dir / "demo.json"
    http = httpx.Client(base_url=url, timeout=30.0)
    try:
        if kept.exists():
            demo = json.loads(kept.read_text())
            answer = http.post(
                "/v1/auth/login", json={"email": demo["email"], "password": demo["password"]}
            )
            if answer.status_code == 200:
                return Target(url=url, token=answer.json()["access_token"], org=demo["org"])
        demo = {"email": f"demo-{secrets.token_hex(4)}@example.com"}
        demo["password"] = secrets.token_urlsafe(18)
        answer = http.post(
            "/v1/auth/register",
            json={**demo, "first_name": "Demo", "last_name": "User"},
        )
        answer.raise_for_status()
        token = answer.json()["access_token"]
        org = http.post(
            "/v1/organizations",
            json={"name": "Spar demo"},
            headers={"Authorization": f"Bearer {token}"},
        )
        org.raise_for_status()
        demo["org"] = org.json()["id"]
        data_dir.mkdir(parents=True, exist_ok=True)  # not made when a Spar was running
        kept.touch(mode=0o600)
        kept.write_text(json.dumps(demo))
        return Target(url=url, token=token, org=demo["org"])
    except httpx.HTTPError as exc:
        raise UsageProblem(f"could not set up the demo organization: {exc}") from None
    finally:
        http.close()


def print_sign_in(console: Console, signed_in: Target) -> None:
    """How to open the results: the sign-in page and the demo user's token to paste
    there (the client takes the same token as SPAR_TOKEN)."""
    say(console, f"To read the results, sign in at {signed_in.url}/ui/login with this token:")
    say(console, f"  {signed_in.token}")
    say(console, f"(the client takes it too: SPAR_URL={signed_in.url} SPAR_TOKEN=<the token>)")


def _register_agent(api: Api, endpoint: str) -> None:
    domains = {d["domain"] for d in api.pages("allowed-domains", "domains")}
    if "127.0.0.1" not in domains:
        api.call("POST", api.path("allowed-domains"), json={"domain": "127.0.0.1"})
    agents = {a["name"]: a for a in api.pages("agents", "agents")}
    if AGENT_NAME in agents:
        agent_path = api.path(f"agents/{agents[AGENT_NAME]['id']}")
        api.call("PATCH", agent_path, json={"endpoint_url": endpoint})
    else:
        api.call(
            "POST",
            api.path("agents"),
            json={"name": AGENT_NAME, "kind": "http", "endpoint_url": endpoint},
        )


@click.command("demo", short_help="Try the whole path on the embedded default, nothing configured.")
@click.option(
    "--data-dir",
    default=str(DEV_DATA_DIR),
    show_default=True,
    help="The embedded database's directory (shared with spar dev).",
)
@click.option("--port", type=int, default=8000, show_default=True, help="Port for Spar's API.")
@click.option(
    "--exit",
    "exit_after",
    is_flag=True,
    help="Stop Spar once the batch is done (default: keep it running until Ctrl-C).",
)
def demo(data_dir: str, port: int, exit_after: bool) -> None:
    """Run the whole path with nothing configured: start Spar on its embedded database,
    make a demo organization, serve a small support agent (with a deliberate flaw), push
    the demo scenarios, run them as a batch with a progress bar, and print the results
    and the link to the results page."""
    console = make_console()
    directory = Path(data_dir)
    with spar_dev(directory, port, console) as url, demo_agent() as endpoint:
        signed_in = _sign_in(url, directory)
        api = Api(signed_in)
        try:
            say(console, f"Spar is up at {url}; demo agent at {endpoint}")
            _register_agent(api, endpoint)
            apply(api, load_dir(SUITE), prune=False, dry_run=False, console=console)
            code = run_batch(
                api,
                agent=AGENT_NAME,
                tags=["demo"],
                scenario_names=[],
                concurrency=5,
                console=console,
            )
        finally:
            api.close()
        if code == EXIT_FAILED:
            console.print(
                "As planned, the demo agent failed a scenario: it approves refunds outside "
                "the 30-day policy.  Open the link above and read the transcript."
            )
        print_sign_in(console, signed_in)
        say(console, LLM_HINT)
        if exit_after:
            raise SystemExit(0 if code in (0, EXIT_FAILED) else code)
        say(console, f"Spar runs at {url}; Ctrl-C stops the demo.")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            console.print("stopping…")
