"""verl adapter: a `BaseTool` whose every call is a Tangram action, and a test-run reward.

verl creates one tool instance per trajectory and calls `create`, `execute` (per tool call),
`calc_reward` and `release`. `TangramTool` maps these onto Tangram: `create` opens the
trajectory's environment (its node is chosen then and kept; with `session: true` a shell
session in it too), `execute` runs the call's command as an action with the demand from the
tool config (in that session, where there is one), `calc_reward` runs the reward command as an
elastic action (`pytest -n <granted cores>`), `release` closes the environment.

The verl tool config (`actor_rollout_ref.rollout.multi_turn.tool_config_path=tools.yaml`):

```yaml
tools:
  - class_name: tangram.adapters.verl.TangramTool
    config:
      type: native
      tangram: {url: "http://head:8470", token: "..."}  # the cluster's one `tangram serve`
      command_param: command      # the tool argument that holds the shell command
      cpu: 1                      # demand per call: 1, [1, 4] (range) or {choices: [1, 2, 4]}
      timeout: 60
      memory_mb: 2048             # reserved for the trajectory's environment
      image: swe-task             # optional: the environment's root is this image (a
      disk_mb: 1024               # sample's create_kwargs `image`/`snapshot` override it)
      max_output: 4000            # characters of output returned to the model
      session: true               # optional: one shell session per trajectory (cwd, variables
                                  # and background jobs persist from call to call)
      reward_command: "pytest -q tests"   # optional: calc_reward runs it, elastic, on (1, 8)
      reward_cpu: [1, 8]
    tool_schema:
      type: function
      function:
        name: bash
        description: Run a shell command in the task's sandbox.
        parameters:
          type: object
          properties: {command: {type: string, description: the command}}
          required: [command]
```

`tangram:` names the scheduler. `{url, token}` (the production setup): every worker process of
every node reaches the cluster's one `tangram serve` through `TangramClient`, so one scheduler
grants every core. `{address: auto, ...}` (a Ray address) or no `url`/`address` (this machine)
builds a Tangram *inside the process*: right for one process, but several worker processes
would then be several schedulers granting the same cores.

Within a process one Tangram (or client) serves every tool instance: it lives on its own
event-loop thread (`TangramRunner`), so verl's loops, threads and the synchronous reward path
all reach it.
verl is optional: without it `TangramTool` keeps the same interface on a plain base class.
"""

from __future__ import annotations

import asyncio
import shlex
import threading
import uuid
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from tangram.errors import ValidationError
from tangram.results import Status
from tangram.runtime.api import TangramApi
from tangram.runtime.client import TangramClient
from tangram.runtime.facade import Tangram

T = TypeVar("T")
SESSION = "verl"  # the trajectory's shell session, where `session: true`

try:  # verl's own base class where verl imports; the same interface without it
    from verl.tools.base_tool import BaseTool as _Base

    _VerlResponse: Any = None
    try:
        from verl.tools.schemas import ToolResponse

        _VerlResponse = ToolResponse
    except ImportError:  # verl before ToolResponse: create returns str, execute text
        pass
    HAVE_VERL = True
except Exception as _exc:  # verl or one of its heavy deps is missing
    VERL_IMPORT_ERROR: str | None = f"{type(_exc).__name__}: {_exc}"
    HAVE_VERL = False
    _VerlResponse = None

    class _Base:  # type: ignore[no-redef]
        def __init__(self, config: dict, tool_schema: Any) -> None:
            self.config = config
            self.tool_schema = tool_schema
            self.name = _schema_name(tool_schema)
else:
    VERL_IMPORT_ERROR = None


@dataclass(frozen=True, slots=True)
class ToolText:
    """Stands in for verl's `ToolResponse` where verl is not installed."""

    text: str | None = None
    image: Any = None
    video: Any = None


def _schema_name(schema: Any) -> str:
    if isinstance(schema, Mapping):
        return str(schema.get("function", {}).get("name", "tangram"))
    return str(getattr(getattr(schema, "function", None), "name", "tangram"))


def _respond(text: str) -> Any:
    if _VerlResponse is not None:
        return _VerlResponse(text=text)
    return text if HAVE_VERL else ToolText(text=text)


class TangramRunner:
    """One Tangram (or `TangramClient` of a shared server) on a private event-loop thread;
    `call` from any loop, `call_sync` from plain threads (verl's reward functions)."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tangram", daemon=True)
        self._thread.start()

        async def build() -> Any:
            tg = factory()  # built on this loop: a client's connections belong to it
            return await tg.start() if isinstance(tg, Tangram) else tg

        self.tangram = self._submit(build()).result()

    def _submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(self._submit(coro))

    def call_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._submit(coro).result()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        tg = self.tangram
        self._submit(tg.aclose() if isinstance(tg, TangramClient) else tg.shutdown()).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


_RUNNERS: dict[str, TangramRunner] = {}
_RUNNERS_LOCK = threading.Lock()


def shared_runner(spec: Mapping[str, Any] | None = None) -> TangramRunner:
    """The process's Tangram for `spec`, built once: `url` (and `token`, `timeout`): a
    `TangramClient` of that server, the scheduler every process shares; `address` (a Ray
    address or `local:N`) or neither: a Tangram in this process, the other keys being options
    of `Tangram.ray` / `Tangram.local`."""
    spec = dict(spec or {})
    key = repr(sorted(spec.items()))
    with _RUNNERS_LOCK:
        if key not in _RUNNERS:
            address = spec.pop("address", None)
            url = spec.pop("url", None)
            if url is not None:
                if address is not None:
                    raise ValidationError(
                        "tool.config.tangram",
                        sorted(spec),
                        "give `url` (a shared server) or `address`, not both",
                    )
                _RUNNERS[key] = TangramRunner(lambda: TangramClient(str(url), **spec))
            elif address is None:
                _RUNNERS[key] = TangramRunner(lambda: Tangram.local(**spec))
            else:
                _RUNNERS[key] = TangramRunner(lambda: Tangram.ray(address, **spec))
        return _RUNNERS[key]


def close_shared() -> None:
    """Shut every shared Tangram down (tests, and the end of a verl worker)."""
    with _RUNNERS_LOCK:
        runners = list(_RUNNERS.values())
        _RUNNERS.clear()
    for r in runners:
        r.close()


def _demand(path: str, v: Any) -> Any:
    """Tool-config demand: an int, [lo, hi] (a range) or {choices: [...]}."""
    if isinstance(v, list) and len(v) == 2:
        return (v[0], v[1])
    if isinstance(v, Mapping) and set(v) == {"choices"}:
        return list(v["choices"])
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    raise ValidationError(path, v, "must be a core count, [lo, hi] or {choices: [...]}")


class TangramTool(_Base):  # type: ignore[misc,valid-type]
    """A verl tool whose calls run as Tangram actions; see the module docstring for config."""

    def __init__(
        self, config: dict, tool_schema: Any, *, runner: TangramRunner | None = None
    ) -> None:
        super().__init__(config, tool_schema)
        self.cpu = _demand("tool.config.cpu", config.get("cpu", 1))
        self.reward_cpu = _demand("tool.config.reward_cpu", config.get("reward_cpu", [1, 8]))
        self.timeout = float(config.get("timeout", 60.0))
        self.memory_mb = int(config.get("memory_mb", 1024))
        self.image = config.get("image")  # per sample: create_kwargs {"image"} or {"snapshot"}
        self.disk_mb = config.get("disk_mb")
        self.max_output = int(config.get("max_output", 4000))
        self.command_param = str(config.get("command_param", "command"))
        self.reward_command = config.get("reward_command")
        self.session = config.get("session", False)
        if not isinstance(self.session, bool):
            raise ValidationError("tool.config.session", self.session, "must be true or false")
        self._runner = runner
        self.envs: dict[str, str] = {}  # instance id -> environment id

    @property
    def runner(self) -> TangramRunner:
        if self._runner is None:
            self._runner = shared_runner(self.config.get("tangram"))
        return self._runner

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> Any:
        iid = instance_id or f"verl-{uuid.uuid4().hex[:12]}"
        tg = self.runner.tangram
        tree = {
            "image": kwargs.get("image", self.image),
            "snapshot": kwargs.get("snapshot"),
            "disk_mb": self.disk_mb,
        }
        if tree["snapshot"] is not None:
            tree["image"] = None
        tree = {k: v for k, v in tree.items() if v is not None}
        env = await self.runner.call(tg.open_env(iid, memory_mb=self.memory_mb, **tree))
        self.envs[iid] = env
        if self.session:  # one shell for the trajectory: each call one command in it
            await self.runner.call(tg.open_session(env, SESSION))
        if HAVE_VERL and _VerlResponse is None:
            return iid
        return iid, _respond("")

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[Any, float, dict]:
        env = self._env(instance_id)
        command = parameters.get(self.command_param) if isinstance(parameters, Mapping) else None
        if not isinstance(command, str) or not command.strip():
            return (
                _respond(f"error: the tool needs a non-empty '{self.command_param}'"),
                0.0,
                {"status": "invalid"},
            )
        tg = self.runner.tangram
        kind = f"tool:{self.name}"
        if self.session:
            call = tg.run(env, SESSION, command, cpu=self.cpu, timeout=self.timeout, kind=kind)
        else:
            call = tg.exec(env, command, cpu=self.cpu, timeout=self.timeout, kind=kind)
        r = await self.runner.call(call)
        return _respond(self._text(r)), 0.0, _metrics(r)

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        if not self.reward_command:
            return 0.0
        tg = self.runner.tangram
        return await self.runner.call(
            run_tests_reward(
                tg,
                self.reward_command,
                env=self._env(instance_id),
                cpu=self.reward_cpu,
                timeout=self.timeout,
            )
        )

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        env = self.envs.pop(instance_id, None)
        if env is not None:
            await self.runner.call(self.runner.tangram.close_env(env))

    def _env(self, instance_id: str) -> str:
        env = self.envs.get(instance_id)
        if env is None:
            raise ValidationError(
                "instance_id", instance_id, "no such tool instance (create it first)"
            )
        return env

    def _text(self, r: Any) -> str:
        head = f"[{r.status}" + (f", exit {r.exit_code}" if r.exit_code is not None else "") + "]"
        body = (r.stdout or "") + (("\n" + r.stderr) if r.stderr else "")
        if r.status is Status.FAILED:
            body = r.detail
        if len(body) > self.max_output:
            body = body[: self.max_output] + f"\n... ({len(body) - self.max_output} more chars)"
        return f"{head}\n{body}" if body else head


def _metrics(r: Any) -> dict[str, Any]:
    pl = r.placement.get("cpu")
    return {
        "status": r.status,
        "queued_s": r.queued_s,
        "run_s": r.run_s,
        "cores": r.units.get("cpu", 0),
        "node": None if pl is None else pl.node,
        "core_ids": [] if pl is None else list(pl.cores),
    }


async def run_tests_reward(
    tg: TangramApi,
    command: str,
    *,
    env: str | None = None,
    cpu: Any = (1, 8),
    timeout: float = 600.0,
    memory_mb: int = 1024,
) -> float:
    """1.0 when `command` (a test run) exits 0, else 0.0. It runs as an elastic action:
    Tangram picks its cores from `cpu` and gives pytest `-n <cores>`. Without `env` it opens
    a throwaway environment and closes it afterwards."""
    own = env is None
    if env is None:
        env = await tg.open_env(f"reward-{uuid.uuid4().hex[:12]}", memory_mb=memory_mb)
    try:
        r = await tg.exec(
            env,
            command,
            cpu=cpu,
            elastic=not isinstance(cpu, int),
            timeout=timeout,
            kind="reward:tests",
        )
        return 1.0 if r.ok else 0.0
    finally:
        if own:
            await tg.close_env(env)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
) -> float:
    """verl `custom_reward_function` (synchronous): writes the solution to
    `extra_info['solution_file']` (default `solution.py`) in a fresh environment and scores it by
    `extra_info['test_command']` (default `pytest -q`) run elastically on (1, 8) cores.
    `extra_info['tangram']` picks the Tangram as in the tool config (default: this machine)."""
    info = dict(extra_info or {})
    runner = shared_runner(info.get("tangram"))
    tg = runner.tangram
    path = str(info.get("solution_file", "solution.py"))
    command = (
        f"printf %s {shlex.quote(solution_str)} > {shlex.quote(path)} && "
        f"{info.get('test_command', 'pytest -q')}"
    )
    return runner.call_sync(
        run_tests_reward(tg, command, cpu=(1, 8), timeout=float(info.get("timeout", 600.0)))
    )
