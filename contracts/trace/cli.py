"""``kvledger record`` and ``kvledger replay``: the trace commands (registered in :mod:`kvledger.contracts.cli`).

``kvledger record --ops N --seed S -o trace.jsonl [--fault Bn] [--model hybrid] [--no-lru] [--system]``
records a random workload of the reference implementation: of its radix cache
(a cache trace), or with ``--system`` of the whole memory manager (requests,
admission, sessions, leak checks: a system trace). Faults B2–B4 act on the
memory manager and imply ``--system``. ``--adapter`` records an engine instead
(``--system --adapter vllm``: vLLM's KV cache manager, its shared blocks
included; an adapter's system model defaults to ``full``).
``kvledger replay trace.jsonl [--json]`` checks a trace against the spec alone.
Exit codes: 0 holds, 1 violation, 2 malformed input or bad arguments.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Annotated, Any, cast

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from kvledger.contracts.adapters.protocol import Unsupported, load_factory
from kvledger.contracts.adapters.reference import ReferenceAdapter
from kvledger.contracts.adapters.system import load_system_factory
from kvledger.contracts.machines.suites import CACHE_MODELS, ENGINE_SYSTEM_CONFIGS, SYSTEM_MODELS, fault_targets
from kvledger.contracts.machines.system import build_manager
from kvledger.contracts.trace.adapter_recorder import CannotRecord, record_adapter_workload
from kvledger.contracts.trace.format import TraceFormatError
from kvledger.contracts.trace.recorder import WorkloadResult, record_workload
from kvledger.contracts.trace.replay import ReplayResult
from kvledger.contracts.trace.replay import replay as replay_trace
from kvledger.contracts.trace.system_recorder import record_system_workload
from kvledger.impl import faults
from kvledger.impl.faults import FAULTS


def _usage(message: str) -> None:
    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {message}")
    raise typer.Exit(2)


MAX_OPS = 10_000_000
"""``record --ops`` at most: about an hour of recording and a few GB of trace; more is a usage error (exit 2)."""


class _Counting(io.TextIOWrapper):
    """The trace file, counting the events (lines) written and telling ``tick`` now and then."""

    def __init__(self, raw: IO[bytes], tick: Callable[[int], None]) -> None:
        super().__init__(raw, encoding="utf-8", newline="")
        self.events, self._next, self._tick = 0, 1024, tick

    def write(self, text: str) -> int:
        self.events += text.count("\n")
        if self.events >= self._next:
            self._next = self.events + 1024
            self._tick(self.events)
        return super().write(text)


def record(
    ops: Annotated[int, typer.Option(min=1, max=MAX_OPS, help=f"random operations to drive (1 to {MAX_OPS:,})")] = 1000,
    seed: Annotated[int, typer.Option(help="random seed of the workload")] = 0,
    output: Annotated[Path, typer.Option("--output", "-o", help="trace file to write (JSON lines)")] = Path(
        "trace.jsonl"
    ),
    fault: Annotated[
        list[str] | None,
        typer.Option("--fault", help="switch a named fault on (B1, B5: radix cache; B2-B4: memory manager)"),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help=f"cache model ({', '.join(CACHE_MODELS)}; default hybrid) or, with --system, "
            f"memory-manager model ({', '.join(SYSTEM_MODELS)}; default mamba; with --adapter also "
            f"{', '.join(m for m in ENGINE_SYSTEM_CONFIGS if m not in SYSTEM_MODELS)}, default full)"
        ),
    ] = None,
    lru: Annotated[bool, typer.Option(help="record LRU links (needed to catch B1)")] = True,
    system: Annotated[
        bool, typer.Option("--system", help="record the whole memory manager (requests, admission, sessions)")
    ] = False,
    adapter: Annotated[
        str | None,
        typer.Option(
            help="record an engine: a cache adapter, or with --system a system adapter (alias or module:factory)"
        ),
    ] = None,
) -> None:
    """Record a random workload of the reference implementation (or of an engine's adapter) as a trace."""
    names = [f.upper() for f in fault or []]
    for f in names:
        if f not in FAULTS:
            _usage(f"unknown fault {f!r}; expected one of {', '.join(sorted(FAULTS))}")
    on_system = [f for f in names if "system" in FAULTS[f].suites]
    on_cache = [f for f in names if "cache" in FAULTS[f].suites]
    if on_system and on_cache:
        _usage(
            f"faults {', '.join(on_cache)} act on the radix cache and {', '.join(on_system)} on the memory manager: "
            "record them in two traces"
        )
    system = system or bool(on_system)
    if system and on_cache:
        _usage(f"fault {on_cache[0]} acts on the radix cache: record it without --system")
    # NOTE: an engine's system adapter is also offered the window kinds (the reference manager has no window model)
    models: Mapping[str, object] = (
        (ENGINE_SYSTEM_CONFIGS if adapter is not None else SYSTEM_MODELS) if system else CACHE_MODELS
    )
    # NOTE: an engine's system adapter defaults to full attention, the one model every engine drives
    model = model or ("hybrid" if not system else "full" if adapter is not None else "mamba")
    if model not in models:
        _usage(
            f"unknown {'memory-manager' if system else 'cache'} model {model!r}; expected one of {', '.join(models)}"
        )
    where = ("system" if system else "cache", model)
    for f in names:
        if where not in fault_targets(FAULTS[f]):
            acts = ", ".join(f"{s}/{m}" for s, m in fault_targets(FAULTS[f]))
            _usage(f"--fault {f} cannot act in {'/'.join(where)}: it acts only in {acts} (pick one with --model)")
    result: WorkloadResult
    engine: Any = None
    if adapter is not None:
        try:
            if system:
                engine = load_system_factory(adapter)(ENGINE_SYSTEM_CONFIGS[model])
            else:
                engine = load_factory(adapter)(CACHE_MODELS[model])
        except Unsupported as err:
            _usage(f"adapter {adapter!r} cannot build the {model} model: {err}")
        except Exception as err:  # an adapter that cannot start is a usage error, not a crash
            _usage(str(err) if isinstance(err, ValueError) else f"adapter {adapter!r}: {type(err).__name__}: {err}")
        from kvledger.contracts.cli import missing_members

        missing = missing_members(engine, system)
        if missing:
            kind = "system adapter" if system else "cache adapter"
            _usage(
                f"adapter {adapter!r}: the factory returned {type(engine).__name__!r}, not a {kind} "
                f"(missing {', '.join(missing)})"
            )
    console = Console(stderr=True, highlight=False)
    with Progress(
        SpinnerColumn(),
        TextColumn(f"[bold]record[/bold] {model} {'memory manager' if system else 'cache'}, {ops:,} operations:"),
        TextColumn("{task.fields[events]:,} events, {task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as progress:
        task = progress.add_task("record", events=0, rate="")
        start = time.perf_counter()

        def tick(events: int) -> None:
            rate = events / max(time.perf_counter() - start, 1e-9)
            progress.update(task, events=events, rate=f"{rate:,.0f} events/s")

        try:
            with open(output, "wb") as raw, _Counting(raw, tick) as out, faults.injected(*names):
                if engine is not None and system:
                    result = record_adapter_workload(engine, ops, seed, out, faults=tuple(names))
                elif engine is not None:
                    result = record_workload(engine, ops, seed, out, lru=lru, faults=tuple(names))
                elif system:
                    result = record_system_workload(
                        build_manager(*SYSTEM_MODELS[model]), ops, seed, out, faults=tuple(names)
                    )
                else:
                    result = record_workload(
                        ReferenceAdapter(CACHE_MODELS[model]), ops, seed, out, lru=lru, faults=tuple(names)
                    )
        except OSError as err:
            _usage(f"cannot write {output}: {err.strerror}")
            return
        except CannotRecord as err:
            _usage(str(err))
            return
    what = "memory manager" if system else "cache"
    typer.echo(f"recorded {result.ops} operations ({result.events} events) of the {model} {what} to {output}")
    if result.broken is not None:
        typer.echo(
            f"the implementation broke {result.broken!r} at operation {result.ops} (the trace ends there): "
            f"{result.stopped_by}",
            err=True,
        )
        raise typer.Exit(1)
    if result.stopped_by:
        typer.echo(f"the implementation stopped the workload: {result.stopped_by}")


def _print(console: Console, path: Path, r: ReplayResult) -> None:
    if r.error is not None:
        console.print(f"[red]malformed trace[/red] {path}: {r.error}", markup=True, highlight=False)
        return
    model = r.header.config.kind if r.header else "?"
    if r.header is not None and r.header.system:
        model = f"memory manager ({model})"
    if r.violation is None:
        console.print(f"[green]holds[/green]: {r.steps} events of {model} replayed against the spec")
    else:
        v = r.violation
        console.print(f"[red bold]VIOLATED {v.rule}[/red bold] at step {v.step} (line {v.line}, {v.op})")
        console.print(v.message, markup=False, highlight=False)
        for subject, events in v.history.items():
            console.print(f"  {subject}:", markup=False, highlight=False)
            for e in events or ["(no earlier event in the trace window)"]:
                console.print(f"    {e}", markup=False, highlight=False)
    if r.checked:
        done = ", ".join(f"{law} ({n}x)" for law, n in sorted(r.checked.items()))
        console.print(f"checked: {done}", markup=False, highlight=False)
    if r.unchecked:
        console.print("not checked:", markup=False, highlight=False)
        for law, why in r.unchecked:
            console.print(f"  {law}: {why}", markup=False, highlight=False)


def replay(
    path: Annotated[Path, typer.Argument(help="trace file (JSON lines) to check")],
    as_json: Annotated[bool, typer.Option("--json", help="print a machine-readable result")] = False,
) -> None:
    """Replay a trace against the spec alone: exit 0 holds, 1 violation, 2 malformed input."""
    console = Console(stderr=as_json)
    try:
        size = os.path.getsize(path)
        stream = open(path, encoding="utf-8", newline="")  # noqa: SIM115
    except OSError as err:
        result = ReplayResult(None, 0, error=TraceFormatError(0, "a readable trace file", str(err.strerror)))
    else:
        with (
            stream,
            Progress(
                TextColumn("[bold]replay"),
                BarColumn(),
                DownloadColumn(),
                TextColumn("{task.fields[events]} events"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
                disable=size < 4_000_000 or (as_json and not sys.stderr.isatty()),
            ) as progress,
        ):
            task = progress.add_task("replay", total=size, events=0)

            def tick(n: int) -> None:
                progress.update(task, completed=cast(IO[bytes], stream.buffer).tell(), events=n)

            result = replay_trace(stream, tick, every=16384)
    if as_json:
        typer.echo(json.dumps({"trace": str(path), **result.to_json()}, indent=2))
    else:
        _print(console, path, result)
    raise typer.Exit(result.exit_code)
