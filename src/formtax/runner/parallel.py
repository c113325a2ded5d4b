"""Data-parallel runs: the grid's chunks sharded over N Ray actors, each with its own backend; one writer.

``formtax run ... --workers N`` (``--ray-address ADDR`` joins an existing cluster instead of starting a local one):

* The driver plans the grid and finds what is pending exactly as a one-process run does, and cuts the pending
  requests into the same chunks (``--batch-size``, strategy by strategy).
* Each actor loads its own backend (one engine per actor: vLLM's own Ray executor is refused on CPU, and
  data-parallel engines are what a grid wants anyway; tensor/pipeline parallelism inside an engine is vLLM's),
  checks every strategy once before any request, and turns a chunk into finished Records with the very function
  the one-process path uses (:func:`~formtax.runner.execute.execute_chunk`).
* Only the driver writes ``records.jsonl``. It keeps at most ``IN_FLIGHT`` chunks queued per actor and appends a
  chunk's records the moment they come back, so the resume guarantees are the one-process ones: a killed driver
  loses at most the chunks in flight, a re-run skips every recorded id, nothing is written twice. Records arrive
  in completion order, not plan order (nothing downstream depends on the order).
* A worker that fails (a server gone, an actor killed) stops the run: the pool is torn down, the records written
  so far stay, and the same command resumes.

Ray is imported only here and only when ``--workers`` > 1 or ``--ray-address`` is given (optional extra
``formtax[ray]``). On a remote cluster, every node needs formtax installed and the model reachable at the same path.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import deque
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from formtax.errors import ConfigError, FormtaxError

if TYPE_CHECKING:
    from formtax.records.schema import Record
    from formtax.runner.config import RunConfig
    from formtax.runner.grid import Planned
    from formtax.tasks import Task

log = logging.getLogger(__name__)

IN_FLIGHT = 2  # chunks queued per actor: one running, one waiting, so no actor idles between chunks


class WorkerFailed(FormtaxError):
    """A worker stopped the run; completed records are kept and re-running the command resumes."""


class _Worker:
    """One backend in one Ray actor process."""

    def __init__(self, config: RunConfig, task: Task, samples: Sequence[Planned]) -> None:
        from formtax.backends import load_backend
        from formtax.runner.config import thinking_flag
        from formtax.runner.execute import load_extractor, request_for, strategy_for

        self.config = config
        self.task = task
        # An exception raised here would reach the driver as Ray's ActorDiedError, which keeps only its text; kept
        # and re-raised by the first method call instead, it arrives as itself (a ConfigError stays one).
        self.failure: Exception | None = None
        try:
            self.backend = load_backend(config.backend, config.model, device=config.device, dtype=config.dtype,
                                        **config.backend_options)
            if config.thinking is not None:
                self.backend.tokenizer.set_thinking(thinking_flag(config.thinking))
            self.extractor = load_extractor(config)
            for p in samples:  # refuse a strategy the backend cannot run, before any request
                strategy_for(p, self.extractor).check(self.backend, [request_for(task, p, config)])
        except Exception as e:  # noqa: BLE001 - re-raised by provenance()
            self.failure = e

    def provenance(self) -> dict[str, Any]:
        from formtax.runner.execute import backend_provenance

        if self.failure is not None:
            raise self.failure
        d = backend_provenance(self.backend)
        d["pid"] = os.getpid()
        return d

    def run(self, chunk: Sequence[Planned]) -> list[Record]:
        from formtax.runner.execute import execute_chunk

        return [rec for _, rec, _ in execute_chunk(self.backend, self.task, chunk, self.config, self.extractor)]


def _cause(e: BaseException) -> BaseException:
    """The worker-side exception inside Ray's wrappers (``RayTaskError.cause``, an actor's failed ``__init__``)."""
    for _ in range(8):
        inner = getattr(e, "cause", None)
        if not isinstance(inner, BaseException) or inner is e:
            break
        e = inner
    return e


class WorkerPool:
    """N actors, started and checked in the constructor; :meth:`run` yields (chunk, records) as they finish."""

    def __init__(self, config: RunConfig, task: Task, samples: Sequence[Planned]) -> None:
        try:
            import ray
        except ImportError as e:
            raise ConfigError("--workers/--ray-address need Ray: pip install 'formtax[ray]'") from e
        if config.workers < 1:
            raise ConfigError(f"--workers must be at least 1, got {config.workers}")
        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            kw: dict[str, Any] = {"include_dashboard": False, "ignore_reinit_error": True, "log_to_driver": False}
            if config.ray_address:
                kw["address"] = config.ray_address
            else:
                kw.update(num_cpus=max(config.workers, os.cpu_count() or 1), object_store_memory=256 * 1024 * 1024)
            ray.init(**kw)
        gpus = 0.0
        if config.device.startswith("cuda"):
            gpus = float(config.backend_options.get("tensor_parallel_size", 1))
        actor = ray.remote(num_cpus=1, num_gpus=gpus, max_restarts=0)(_Worker)
        self.actors = [actor.remote(config, task, list(samples)) for _ in range(config.workers)]
        try:
            self.provenance: dict[str, Any] = ray.get([a.provenance.remote() for a in self.actors])[0]
        except Exception as e:
            self.close()
            cause = _cause(e)
            if isinstance(cause, FormtaxError):
                raise cause from None
            raise WorkerFailed(f"a worker failed to start: {cause}") from e
        self.provenance["workers"] = config.workers
        if config.ray_address:
            self.provenance["ray_address"] = config.ray_address

    def run(self, chunks: Sequence[Sequence[Planned]]) -> Iterator[tuple[Sequence[Planned], list[Record]]]:
        ray = self.ray
        todo = deque(chunks)
        in_flight: dict[Any, tuple[int, Sequence[Planned]]] = {}

        def submit(i: int) -> None:
            if todo:
                chunk = todo.popleft()
                in_flight[self.actors[i].run.remote(list(chunk))] = (i, chunk)

        for i in range(len(self.actors)):
            for _ in range(IN_FLIGHT):
                submit(i)
        while in_flight:
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            ref = ready[0]
            i, chunk = in_flight.pop(ref)
            try:
                records = ray.get(ref)
            except Exception as e:
                cause = _cause(e)
                raise WorkerFailed(f"worker {i} failed: {type(cause).__name__}: {cause}; the records written so far "
                                   "are kept, re-run the same command to resume") from e
            submit(i)
            yield chunk, records

    def close(self) -> None:
        for a in getattr(self, "actors", []):
            with contextlib.suppress(Exception):  # an actor that is already gone
                self.ray.kill(a)
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()
