"""Where Spar stands: the batch bench's workload on Spar and on a peer, side by side.

One invocation, one set of loopback fakes (``bench/fakes.py``: the agent speaking Spar's
``spar`` protocol after ``--agent-ms``, the judge speaking OpenAI chat completions after
``--judge-ms``), the same workload for every tool: N scenarios x T user turns, each turn
judged on C LLM-judged criteria (concurrently, after the agent's reply), K conversations
at once.  For each tool it prints the efficiency, ideal / wall with the ideal
⌈N/K⌉ x T x (agent + judge latency) as ``bench/batch.py`` computes it, the wall time and
the CPU per turn (fakes excluded), then the ratios Spar / peer.

* **Spar**: ``bench/batch.py``'s first batch (:func:`bench.batch.first_batch`: a throwaway
  database, a private Redis, ``spar serve`` and ``--workers`` ``spar worker`` processes,
  the workers booted before the batch is sent).  Wall: submit → the batch's
  ``completed_at``; CPU: Spar's processes, and PostgreSQL's backends and Redis beside them.
* **Inspect AI** (``--peers inspect``), pinned to :data:`INSPECT_AI` and installed on first
  use with ``openai`` into a virtualenv of its own under ``~/.cache/spar-bench/peers/``
  (``$XDG_CACHE_HOME`` if set), never into Spar's environment.  The eval script
  (:data:`INSPECT_EVAL`, written into a temporary directory and run by that venv's python)
  is written as an Inspect user would write it: the agent under test is the eval's
  *model*, a custom model API (``@modelapi``) speaking the ``spar`` protocol over httpx
  (Inspect's way to evaluate what none of its providers speaks: each turn is then a
  model call with Inspect's connection limit, retries and transcript, as the judge's are);
  a solver plays a sample's turns with ``generate()`` and after each reply asks the judge,
  Inspect's ``openai`` provider as ``openai/judge-1`` with ``base_url`` = the fake judge
  (the ``judge`` model role), the turn's criteria at once with ``collect()``; a scorer
  reads the verdicts.  ``max_samples`` = K, ``max_connections`` K for the agent and K x C
  for the judge, so neither pool is the bound; Inspect's defaults otherwise (its eval log
  written to the temporary directory).  Wall: the ``eval()`` call, timed inside the
  script after its imports and set-up; CPU: the script's process and its children, from
  ``/proc`` around that call.

Figures are printed, not asserted.  Run from the repository root::

    python bench/peers.py -n 200 -k 50 --workers 2 --threads 32

A peer is a :class:`Peer` in :data:`PEERS`: its name, its pinned version and how it runs
the workload against the fakes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import venv
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from bench.batch import first_batch, ideal_s, workload_arguments
from bench.stack import (
    ROOT,
    Fakes,
    cpu_seconds,
    database_url,
    loopback_fakes,
    unwind_on_sigterm,
)
from shared.llm.judge import SYSTEM_PROMPT

INSPECT_AI = "0.3.285"
OPENAI = "3.57.0"  # the SDK Inspect's openai provider drives, pinned beside it


@dataclass(frozen=True)
class Figures:
    """One tool's run of the workload."""

    tool: str
    version: str
    wall_s: float
    cpu_s: float  # everything but the fakes
    cpu_parts: str  # how ``cpu_s`` splits, for the table
    served: dict[str, int]  # the calls the fakes answered during the run
    outcome: str  # how many conversations ended, as the tool reports it


class Peer(Protocol):
    name: str
    version: str

    def run(self, args: argparse.Namespace, fake: Fakes) -> Figures:
        """The workload of ``args`` against ``fake`` (already at its latency)."""
        ...


# --- a peer's own environment ------------------------------------------------------------------


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "spar-bench" / "peers"


def peer_python(name: str, requirements: list[str]) -> Path:
    """The python of a virtualenv holding exactly ``requirements`` (pinned), made and
    installed on first use.  A marker written after a successful install says which
    requirements it holds, so an interrupted install or a new pin installs again."""
    home = cache_dir() / name
    python = home / "bin" / "python"
    marker = home / ".spar-bench-requirements"
    wanted = "\n".join(requirements)
    if marker.exists() and marker.read_text() == wanted and python.exists():
        return python
    print(f"installing {' '.join(requirements)} into {home} (once)", flush=True)
    if not python.exists():
        venv.create(home, with_pip=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *requirements], check=True)
    marker.write_text(wanted)
    return python


def tree_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds so far of a process and each of its live descendants."""
    pids = [pid]
    with contextlib.suppress(psutil.NoSuchProcess):
        pids += [child.pid for child in psutil.Process(pid).children(recursive=True)]
    return {p: cpu_seconds(p) for p in pids}


def spent_since(before: dict[int, float], now: dict[int, float]) -> float:
    """A process born in between counts whole; one that is gone, not at all (a floor)."""
    return sum(t - before.get(pid, 0.0) for pid, t in now.items())


def served_since(fake: Fakes, before: dict[str, int]) -> dict[str, int]:
    now = fake.served()
    return {name: now[name] - before.get(name, 0) for name in ("agent", "judge")}


# --- Spar ----------------------------------------------------------------------------------------


def spar_version() -> str:
    """The installed version and the tree's commit."""
    git = shutil.which("git")
    commit = (
        git
        and subprocess.run(
            [git, "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    )
    return f"{metadata.version('spar')}" + (f" ({commit})" if commit else "")


def run_spar(args: argparse.Namespace, fake: Fakes) -> Figures:
    before = fake.served()
    done, spent = first_batch(args, database_url("peers"), fake)
    turns = args.scenarios * args.turns
    return Figures(
        tool="Spar",
        version=spar_version(),
        wall_s=done["wall_s"],
        cpu_s=spent.stack,
        cpu_parts=(
            f"Spar's processes {spent.spar / turns * 1000:.1f} + PostgreSQL, Redis "
            f"{(spent.database + spent.redis) / turns * 1000:.1f}"
        ),
        served=served_since(fake, before),
        outcome=f"{done['completed_scenarios']}/{done['total_scenarios']} runs {done['status']}",
    )


# --- Inspect AI ----------------------------------------------------------------------------------

# The eval, as an Inspect user would write it.  It is run by the peer's own python, so
# it imports nothing of Spar's: the judge's prompt is a copy of shared/llm/judge.py's, so
# both tools send the same work.
INSPECT_EVAL = r'''"""Spar's batch workload as an Inspect AI eval, by Spar's bench/peers.py.

The agent under test is the eval's model: a custom model API (``spar_agent``) playing one
turn of Spar's ``spar`` HTTP protocol per ``generate()``.  A solver plays a sample's user
turns in order and, after each reply, asks the judge (the ``judge`` model role:
``openai/judge-1`` on the fake's ``base_url``) the turn's criteria at once; a scorer marks
the sample correct when every verdict is PASS.

With bench/peers.py: one JSON argument (the workload, the fakes' URLs); set up, it prints
``PEER {"event": "ready"}`` and waits for a line on stdin, runs the eval, prints
``PEER {"event": "done", ...}`` and waits for another line before it exits, so that its
CPU is read from /proc around the eval alone.
"""

import json
import sys
import time

import httpx
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import (
    ChatMessageSystem,
    ChatMessageUser,
    GenerateConfig,
    ModelAPI,
    ModelOutput,
    ModelUsage,
    get_model,
    modelapi,
)
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.util import collect

WORK = json.loads(sys.argv[1])
MOMENTS = {}  # perf_counter() of the first agent call and of the last sample's last verdict

JUDGE_SYSTEM = WORK["judge_system"]  # Spar's own judge prompt


def say(event, **figures):
    print("PEER " + json.dumps({"event": event, **figures}), flush=True)


@modelapi(name="spar_agent")
class SparAgent(ModelAPI):
    """An agent of Spar's ``spar`` protocol as an Inspect model: POST the user's message
    and the conversation so far to ``base_url``, read ``{"content", "usage"}``."""

    def __init__(self, model_name, base_url=None, api_key=None, config=None, **model_args):
        super().__init__(model_name, base_url, api_key, [], config or GenerateConfig())
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self.client = httpx.AsyncClient(timeout=60, limits=limits)

    async def aclose(self):
        await self.client.aclose()

    def max_connections(self):
        return WORK["concurrency"]

    async def generate(self, input, tools, tool_choice, config):
        messages = [{"role": m.role, "content": m.text} for m in input]
        body = {
            "session_id": (config.extra_body or {}).get("session_id"),
            "message": messages[-1]["content"],
            "messages": messages,
            "customer_context": {},
            "metadata": {},
        }
        MOMENTS.setdefault("first_call", time.perf_counter())
        response = await self.client.post(self.base_url, json=body)
        response.raise_for_status()
        data = response.json()
        tokens_in = (data.get("usage") or {}).get("input_tokens", 0)
        tokens_out = (data.get("usage") or {}).get("output_tokens", 0)
        output = ModelOutput.from_content(self.model_name, data["content"])
        output.usage = ModelUsage(
            input_tokens=tokens_in, output_tokens=tokens_out, total_tokens=tokens_in + tokens_out
        )
        return output


async def verdict(question, state):
    conversation = "\n".join(f"{m.role.upper()}: {m.text}" for m in state.messages)
    prompt = (
        f"Criterion: {question}\n\n"
        f"Conversation so far (the last ASSISTANT message is the one to judge):\n{conversation}"
    )
    output = await get_model(role="judge").generate(
        [ChatMessageSystem(content=JUDGE_SYSTEM), ChatMessageUser(content=prompt)]
    )
    return str(json.loads(output.completion)["verdict"]).upper()


@solver
def play_and_judge():
    """Each user turn in order: the agent's reply, then the turn's criteria judged at once."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        verdicts = []
        for index, turn in enumerate(state.metadata["turns"]):
            if index:
                state.messages.append(ChatMessageUser(content=turn["message"]))
            state = await generate(state, extra_body={"session_id": str(state.sample_id)})
            verdicts += await collect(*(verdict(q, state) for q in turn["criteria"]))
        state.store.set("verdicts", verdicts)
        MOMENTS["last_verdict"] = time.perf_counter()
        return state

    return solve


@scorer(metrics=[accuracy()])
def every_criterion():
    async def score(state: TaskState, target: Target) -> Score:
        verdicts = state.store.get("verdicts", [])
        passed = all(v == "PASS" for v in verdicts)
        return Score(value=CORRECT if passed else INCORRECT, explanation=" ".join(verdicts))

    return score


def samples():
    found = []
    for s in range(WORK["scenarios"]):
        turns = [
            {
                "message": f"question {t} of scenario {s}",
                "criteria": [
                    f"Does the reply answer question {t}? (criterion {c})"
                    for c in range(WORK["criteria"])
                ],
            }
            for t in range(WORK["turns"])
        ]
        found.append(Sample(id=s, input=turns[0]["message"], metadata={"turns": turns}))
    return found


def main():
    task = Task(dataset=samples(), solver=play_and_judge(), scorer=every_criterion())
    judge = get_model(
        "openai/judge-1",
        base_url=f"{WORK['judge_url']}/v1",
        api_key="bench",
        responses_api=False,  # an OpenAI-compatible server: chat completions
        config=GenerateConfig(max_connections=WORK["concurrency"] * max(1, WORK["criteria"])),
    )
    say("ready")
    sys.stdin.readline()
    started = time.perf_counter()
    [log] = eval(
        task,
        model="spar_agent/agent",
        model_base_url=f"{WORK['agent_url']}/chat",
        model_roles={"judge": judge},
        max_samples=WORK["concurrency"],
        # Applies to the judge role too: K conversations, C verdicts each at once.
        max_connections=WORK["concurrency"] * max(1, WORK["criteria"]),
        log_dir=WORK["log_dir"],
        display="none",
    )
    ended = time.perf_counter()
    metrics = log.results.scores[0].metrics if log.results and log.results.scores else {}
    say(
        "done",
        wall_s=ended - started,
        first_call_s=MOMENTS.get("first_call", ended) - started,
        after_last_s=ended - MOMENTS.get("last_verdict", ended),
        status=log.status,
        error=log.error.message if log.error else None,
        samples=log.results.completed_samples if log.results else 0,
        accuracy=metrics["accuracy"].value if "accuracy" in metrics else None,
    )
    sys.stdin.readline()


if __name__ == "__main__":
    main()
'''


class InspectAI:
    name = "Inspect AI"
    version = INSPECT_AI

    def run(self, args: argparse.Namespace, fake: Fakes) -> Figures:
        python = peer_python(
            f"inspect-ai-{INSPECT_AI}", [f"inspect-ai=={INSPECT_AI}", f"openai=={OPENAI}"]
        )
        print(
            f"{self.name} {self.version} (openai {OPENAI}): {python}; "
            "the agent as a custom model API, the judge on Inspect's openai provider",
            flush=True,
        )
        with tempfile.TemporaryDirectory(prefix="spar-bench-inspect-") as work:
            script = Path(work) / "spar_workload.py"
            script.write_text(INSPECT_EVAL)
            workload = {
                "scenarios": args.scenarios,
                "turns": args.turns,
                "criteria": args.criteria,
                "concurrency": args.concurrency,
                "agent_url": fake.agent_url,
                "judge_url": fake.judge_url,
                "judge_system": SYSTEM_PROMPT,
                "log_dir": str(Path(work) / "logs"),
            }
            # Its own environment: nothing of Spar's on its path.
            env = {
                name: value
                for name, value in os.environ.items()
                if name not in ("PYTHONPATH", "VIRTUAL_ENV")
            }
            command = [str(python), str(script), json.dumps(workload)]
            with contextlib.closing(_Script(command, work, env, args.timeout)) as peer:
                peer.said("ready")
                before_cpu, before_served = tree_cpu_seconds(peer.pid), fake.served()
                peer.go()
                done = peer.said("done")
                cpu = spent_since(before_cpu, tree_cpu_seconds(peer.pid))
                served = served_since(fake, before_served)
        span_s = done["wall_s"] - done["first_call_s"] - done["after_last_s"]
        print(
            f"  eval() took {done['wall_s']:.2f} s (the wall time): its first agent call "
            f"{done['first_call_s']:.2f} s after it began (the eval's set-up, lazy imports), "
            f"its end {done['after_last_s']:.2f} s after the last verdict (the scoring, the "
            f"log); first call -> last verdict {span_s:.2f} s (efficiency "
            f"{ideal_s(args) / span_s:.3f}); CPU {cpu:.2f} s",
            flush=True,
        )
        if done["status"] != "success":
            print(f"{self.name}: eval {done['status']}: {done['error']}", flush=True)
        turns = args.scenarios * args.turns
        return Figures(
            tool=self.name,
            version=self.version,
            wall_s=done["wall_s"],
            cpu_s=cpu,
            cpu_parts=f"its process {cpu / turns * 1000:.1f}",
            served=served,
            outcome=f"{done['samples']}/{args.scenarios} samples, eval {done['status']}",
        )


class _Script:
    """A peer's script, which speaks in ``PEER {...}`` lines on its stdout (anything else
    it prints passes through) and waits on its stdin where it must: killed after
    ``timeout_s``, and at the end if it does not exit by itself."""

    def __init__(self, command: list[str], cwd: str, env: dict[str, str], timeout_s: float):
        self._process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.pid = self._process.pid
        self._watchdog = threading.Timer(timeout_s, self._process.kill)
        self._watchdog.start()

    def said(self, event: str) -> dict[str, Any]:
        """Its next ``PEER`` line, which must be ``event``."""
        assert self._process.stdout is not None
        for line in self._process.stdout:
            if not line.startswith("PEER "):
                print(f"  | {line}", end="")
                continue
            message = json.loads(line[len("PEER ") :])
            if message["event"] != event:
                raise RuntimeError(f"expected {event!r} from the peer, got {message}")
            return message
        raise RuntimeError(f"the peer exited ({self._process.wait()}) before {event!r}")

    def go(self) -> None:
        """The line it waits for."""
        assert self._process.stdin is not None
        self._process.stdin.write("go\n")
        self._process.stdin.flush()

    def close(self) -> None:
        self._watchdog.cancel()
        with contextlib.suppress(OSError):
            assert self._process.stdin is not None
            self._process.stdin.close()  # its last wait ends
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


PEERS: dict[str, Peer] = {"inspect": InspectAI()}


# --- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_arguments(parser, scenarios=200, concurrency=50, threads=32)
    parser.add_argument(
        "--peers",
        default="inspect",
        help=f"comma-separated peers to run beside Spar: {', '.join(PEERS)} (default inspect)",
    )
    parser.add_argument("--no-spar", action="store_true", help="run the peers only")
    args = parser.parse_args(argv)
    args.batches, args.first_batch = 1, True  # Spar's side: bench/batch.py --first-batch
    args.peers = [name.strip() for name in args.peers.split(",") if name.strip()]
    unknown = [name for name in args.peers if name not in PEERS]
    if unknown:
        parser.error(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(PEERS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    unwind_on_sigterm()
    n, t, c, k = args.scenarios, args.turns, args.criteria, args.concurrency
    print(
        f"peers benchmark: N={n} scenarios x T={t} turns x C={c} criteria, K={k}; agent "
        f"{args.agent_ms:g} ms/turn, judge {args.judge_ms:g} ms/criterion; "
        f"ideal {ideal_s(args):.2f} s; {args.fakes} fakes; {os.cpu_count()} CPUs; load {_load()}",
        flush=True,
    )
    figures = []
    with loopback_fakes(args.fakes) as fake:
        fake.set_latency(args.agent_ms / 1000, args.judge_ms / 1000)
        if not args.no_spar:
            print("--- Spar (bench/batch.py --first-batch)", flush=True)
            figures.append(run_spar(args, fake))
        for name in args.peers:
            peer = PEERS[name]
            print(f"--- {peer.name} {peer.version}  (load {_load()})", flush=True)
            figures.append(peer.run(args, fake))
    report(figures, ideal_s(args), n * t, (n * t, n * t * c))


def report(figures: list[Figures], ideal: float, turns: int, calls: tuple[int, int]) -> None:
    print(f"\nideal {ideal:.2f} s; load {_load()}")
    print(
        f"{'tool':<12} {'version':<18} {'efficiency':>10} {'wall':>9} {'CPU/turn':>10}  "
        "CPU per turn in ms, by part; calls the fakes served (agent, judge); outcome"
    )
    for f in figures:
        print(
            f"{f.tool:<12} {f.version:<18} {ideal / f.wall_s:>10.3f} {f.wall_s:>7.2f} s "
            f"{f.cpu_s / turns * 1000:>7.1f} ms  {f.cpu_parts}; "
            f"{f.served['agent']}, {f.served['judge']} (of {calls[0]}, {calls[1]}); {f.outcome}"
        )
    spar = next((f for f in figures if f.tool == "Spar"), None)
    if spar is None:
        return
    for peer in figures:
        if peer is spar:
            continue
        print(
            f"Spar / {peer.tool}: efficiency {peer.wall_s / spar.wall_s:.2f} x, "
            f"CPU per turn {spar.cpu_s / peer.cpu_s:.3f} x "
            f"({peer.tool} spends {peer.cpu_s / spar.cpu_s:.1f} x Spar's CPU per turn)"
        )


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
