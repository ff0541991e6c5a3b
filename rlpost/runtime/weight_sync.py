"""Trainer weights to the engines, three ways, behind one small interface.

- disk: rank 0 writes an HF folder, every engine loads it (update_weights_from_disk); works
  everywhere, and the folder of the last version is what a restarted engine reloads.
- tensor (colocated GPUs): each train rank flattens size-bounded buckets on its GPU and
  passes CUDA IPC handles; the engine sharing those GPUs maps them without a copy
  (update_weights_from_tensor).
- distributed (decoupled GPUs): train rank 0 and every engine rank form one NCCL group;
  buckets are broadcast while each engine receives (update_weights_from_distributed).

`update_engines` wraps any of them: generation paused, cache flushed, weights pushed, each
engine's version checked, generation resumed; then an optional logprob probe.

Every step that calls all train ranks (an export, a bucket gathered from the shards) is
awaited as one collective (`rank_calls.await_ranks`): a rank that died or hangs ends the update
with a RunFault naming it within trainer.collective_timeout_s, not a driver that waits for ever;
the disk export counts that time from the last byte it wrote, as a checkpoint save does. So is
each call of the distributed sync on rank 0 alone (the group's address, joining it, each
broadcast, leaving it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import shutil
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rlpost.backends.fp8_format import Fp8Format
from rlpost.backends.hf_folder import staging_folders
from rlpost.backends.sglang.trainer_calls import trainer_side
from rlpost.runtime.checkpoint import bytes_under
from rlpost.runtime.failures import RunFault
from rlpost.runtime.rank_calls import TRAIN_RANKS, Awaited, await_ranks
from rlpost.runtime.rollout.client import EngineClient, EngineRequestError
from rlpost.runtime.rollout.manager import NEUTRAL_SAMPLING

if TYPE_CHECKING:
    from rlpost.backends.sglang.buckets import WeightInfo

log = logging.getLogger(__name__)

TrainerCall = Callable[..., Awaitable[Any]]
"""`call(rank, fn, *args)`: run `fn(trainer, *args)` on train rank `rank`."""

DEFAULT_TIMEOUT_S = 600.0  # trainer.collective_timeout_s's default


class _Ranks:
    """Calls on every train rank for one push, each awaited as one collective
    (`await_ranks`). Once one has failed for a rank (dead, or not answering), `failed` is set:
    the push's clean-ups (closing the stream, releasing a bucket) are not asked of ranks that
    cannot answer them, which would cost another timeout and report the clean-up instead of
    the step that failed."""

    def __init__(
        self, call: TrainerCall, num_ranks: int, timeout_s: float, who: Awaited = TRAIN_RANKS
    ) -> None:
        self.call, self.num_ranks, self.timeout_s, self.who = call, num_ranks, timeout_s, who
        self.failed = False

    async def every(
        self,
        what: str,
        fn: Callable[..., Any],
        *args: Any,
        progress: Callable[[], int] | None = None,
    ) -> list[Any]:
        """`fn(trainer, *args)` on every rank; `progress` as `await_ranks` takes it."""
        calls = [self.call(rank, fn, *args) for rank in range(self.num_ranks)]
        try:
            return await await_ranks(what, calls, self.timeout_s, progress, self.who)
        except RunFault:
            self.failed = True
            raise


class WeightSync(Protocol):
    """Sends the trainer's current weights to some engines, labelled `version`."""

    async def push(self, version: int, worker_urls: Sequence[str]) -> None: ...

    async def close(self) -> None: ...


class WeightSyncError(RuntimeError):
    """Engines that did not take the weights, or that serve other weights than the trainer."""


# ---- disk -------------------------------------------------------------------------------


class DiskSync:
    """Rank 0 exports `weights_dir/v<version>` once per version; engines load it. Only the
    newest folder is kept: it is what a restarted engine catches up from."""

    def __init__(
        self,
        client: EngineClient,
        call: TrainerCall,
        num_ranks: int,
        weights_dir: Path,
        fp8: Fp8Format | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        ranks: Awaited = TRAIN_RANKS,
    ) -> None:
        self.client, self.call, self.num_ranks = client, call, num_ranks
        self.weights_dir = weights_dir
        self.fp8 = fp8
        self.timeout_s, self.ranks = timeout_s, ranks
        self.exported: int | None = None

    def folder(self, version: int) -> Path:
        return self.weights_dir / f"v{version}"

    async def push(self, version: int, worker_urls: Sequence[str]) -> None:
        target = self.folder(version)
        if self.exported != version:
            # Every rank enters (the export ends in a barrier); rank 0 writes.
            staged = [target, Path(f"{target}{UNQUANTISED}")]
            await _Ranks(self.call, self.num_ranks, self.timeout_s, self.ranks).every(
                f"the export of weight version {version} for the engines",
                _export, str(target), self.fp8,
                progress=lambda: sum(bytes_under(f) for o in staged for f in staging_folders(o)),
            )  # fmt: skip
            if self.exported is not None:
                shutil.rmtree(self.folder(self.exported), ignore_errors=True)
            self.exported = version
        await self.client.update_weights_from_disk(
            str(target), weight_version=str(version), worker_urls=worker_urls
        )

    async def close(self) -> None:
        return None


UNQUANTISED = ".unquantised"  # the folder an FP8 export is converted from: out_dir + this


def _export(trainer: Any, out_dir: str, fp8: Fp8Format | None = None) -> str:
    """The policy as an HF folder; for FP8 engines, converted as tools/convert_hf_to_fp8.py
    converts (rank 0, after every rank's part of the export)."""
    if fp8 is None:
        return str(trainer.export_hf(out_dir))
    from rlpost.backends.fp8_convert import convert_folder

    unquantised = f"{out_dir}{UNQUANTISED}"
    trainer.export_hf(unquantised)
    if _rank() == 0:
        convert_folder(unquantised, out_dir, fp8)
        shutil.rmtree(unquantised, ignore_errors=True)
    return out_dir


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


# ---- shared by the bucketed ways ----------------------------------------------------------


async def _weight_buckets(
    ranks: _Ranks, bucket_bytes: int, fp8: Fp8Format | None
) -> AsyncGenerator[list[WeightInfo], None]:
    """The trainers' weights bucket by bucket. Every rank steps through the stream together
    (a sharded trainer gathers each bucket collectively); the bucket stays current on every
    rank until the next step, which drops it before gathering another: nothing looks ahead,
    so the last bucket is known only once the stream ends (the version follows it, see
    `_announce_version`)."""
    opening = trainer_side.open_weight_stream
    await ranks.every("opening the weight stream", opening, bucket_bytes, fp8)
    try:
        for index in itertools.count():
            steps = await ranks.every(
                f"gathering weight bucket {index}", trainer_side.next_weight_bucket
            )
            if steps[0] is None:
                return
            yield steps[0]
    finally:
        if not ranks.failed:
            await ranks.every("closing the weight stream", trainer_side.close_weight_stream)


async def _announce_version(client: EngineClient, version: int, worker_urls: Sequence[str]) -> None:
    """Every bucket is in: the engines serve `version` from now on. Not before: an update
    that fails halfway leaves the engines at the old version, which the version check after
    the push reports."""
    await client.update_weight_version(str(version), worker_urls)


def _check_answers(answers: Sequence[Any], what: str) -> None:
    failed = [a for a in answers if not (isinstance(a, Mapping) and a.get("success", True))]
    if failed:
        raise WeightSyncError(f"{what} failed on {len(failed)} engine(s): {failed[:2]}")


# ---- tensor (colocated, CUDA IPC) ---------------------------------------------------------


class TensorSync:
    """Bucket by bucket: every train rank flattens it on its GPU and hands out an IPC
    handle; each engine gets, per TP rank, the handle from the train rank on that GPU."""

    def __init__(
        self,
        client: EngineClient,
        call: TrainerCall,
        num_ranks: int,
        engine_ranks: Callable[[str], Sequence[int]],
        bucket_bytes: int,
        fp8: Fp8Format | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        ranks: Awaited = TRAIN_RANKS,
    ) -> None:
        self.client, self.call, self.num_ranks = client, call, num_ranks
        self.engine_ranks = engine_ranks
        self.bucket_bytes = bucket_bytes
        self.fp8 = fp8
        self.timeout_s, self.ranks = timeout_s, ranks

    async def push(self, version: int, worker_urls: Sequence[str]) -> None:
        ranks = _Ranks(self.call, self.num_ranks, self.timeout_s, self.ranks)
        stream = _weight_buckets(ranks, self.bucket_bytes, self.fp8)
        async with contextlib.aclosing(stream) as buckets:
            async for _ in buckets:
                try:
                    await self._send(ranks, worker_urls)
                finally:
                    # the engines have mapped (and copied from) the bucket: free it everywhere
                    if not ranks.failed:
                        await ranks.every("releasing a weight bucket", trainer_side.release_bucket)
        await _announce_version(self.client, version, worker_urls)

    async def _send(self, ranks: _Ranks, worker_urls: Sequence[str]) -> None:
        payloads = await ranks.every("sharing a weight bucket", trainer_side.tensor_bucket_payload)
        answers = await asyncio.gather(
            *(
                self.client.post(url, "/update_weights_from_tensor", {
                    "serialized_named_tensors": [payloads[r] for r in self.engine_ranks(url)],
                    "load_format": "flattened_bucket",
                    # update_engines flushed the cache before the push, and the engines
                    # are paused until it ends
                    "flush_cache": False,
                })
                for url in worker_urls
            )
        )  # fmt: skip
        _check_answers(answers, "update_weights_from_tensor")

    async def close(self) -> None:
        return None


# ---- distributed (one group: train rank 0 + every engine rank) --------------------------


class DistributedSync:
    """Forms the group for the engines being pushed to (again whenever that set changes,
    e.g. after a restart), then broadcasts bucket by bucket while each engine receives."""

    _names = itertools.count()

    def __init__(
        self,
        client: EngineClient,
        call: TrainerCall,
        *,
        num_ranks: int,
        gpus_per_engine: int,
        bucket_bytes: int,
        backend: str = "nccl",
        multi_node: bool = False,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        fp8: Fp8Format | None = None,
        ranks: Awaited = TRAIN_RANKS,
    ) -> None:
        self.client, self.call, self.num_ranks = client, call, num_ranks
        self.gpus_per_engine = gpus_per_engine
        self.bucket_bytes = bucket_bytes
        self.backend = backend
        self.multi_node = multi_node
        self.timeout_s, self.ranks = timeout_s, ranks
        self.fp8 = fp8
        self.group_name: str | None = None
        self.group_urls: tuple[str, ...] = ()

    async def push(self, version: int, worker_urls: Sequence[str]) -> None:
        await self._form_group(tuple(worker_urls))
        ranks = _Ranks(self.call, self.num_ranks, self.timeout_s, self.ranks)
        stream = _weight_buckets(ranks, self.bucket_bytes, self.fp8)
        async with contextlib.aclosing(stream) as buckets:
            async for bucket in buckets:
                await self._send(bucket, worker_urls)
        await _announce_version(self.client, version, worker_urls)

    async def _send(self, bucket: Sequence[WeightInfo], worker_urls: Sequence[str]) -> None:
        body = {
            "names": [w.name for w in bucket],
            "dtypes": [w.dtype for w in bucket],
            "shapes": [list(w.shape) for w in bucket],
            "group_name": self.group_name,
            "flush_cache": False,  # flushed before the push (update_engines), and paused
        }
        sends = self._on_rank_0(
            "broadcasting a weight bucket", trainer_side.broadcast_bucket, self.group_name
        )
        receives = [
            self.client.post(u, "/update_weights_from_distributed", body) for u in worker_urls
        ]
        answers = await asyncio.gather(sends, *receives)
        _check_answers(answers[1:], "update_weights_from_distributed")

    async def _form_group(self, urls: tuple[str, ...]) -> None:
        if self.group_name is not None and urls == self.group_urls:
            return
        await self.close()
        name = f"rlpost_weights_{next(self._names)}"
        address = await self._on_rank_0(
            "choosing the weight-update group's address",
            trainer_side.update_group_address,
            self.multi_node,
        )
        world = 1 + len(urls) * self.gpus_per_engine
        joins = [
            self.client.post(url, "/init_weights_update_group", {
                "master_address": address[0],
                "master_port": address[1],
                "rank_offset": 1 + i * self.gpus_per_engine,
                "world_size": world,
                "group_name": name,
                "backend": self.backend,
            })
            for i, url in enumerate(urls)
        ]  # fmt: skip
        host = self._on_rank_0(
            "joining the weight-update group",
            trainer_side.join_update_group, address, world, name, self.backend, self.timeout_s,
        )  # fmt: skip
        answers = await asyncio.gather(host, *joins)
        _check_answers(answers[1:], "init_weights_update_group")
        self.group_name, self.group_urls = name, urls
        log.info("weight-update group %s: %d ranks at %s:%d", name, world, *address)

    async def close(self) -> None:
        """Leave the current group; engines that died with it are not asked."""
        name, urls = self.group_name, self.group_urls
        self.group_name, self.group_urls = None, ()
        if name is None:
            return
        leaving = [
            self.client.post(u, "/destroy_weights_update_group", {"group_name": name}) for u in urls
        ]
        results = await asyncio.gather(*leaving, return_exceptions=True)
        for url, result in zip(urls, results, strict=True):
            if isinstance(result, BaseException):
                log.info("engine %s did not leave group %s: %s", url, name, result)
        await self._on_rank_0(
            "leaving the weight-update group", trainer_side.leave_update_group, name
        )

    async def _on_rank_0(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(trainer, *args)` on train rank 0, the group's member, within the timeout
        (`await_ranks`): a rank 0 stuck there is named, not waited for."""
        call = [self.call(0, fn, *args)]
        return (await await_ranks(what, call, self.timeout_s, who=self.ranks))[0]


# ---- choosing one --------------------------------------------------------------------------


@dataclass(frozen=True)
class SyncContext:
    """What any of the ways may need; each takes its part."""

    client: EngineClient
    call: TrainerCall
    num_ranks: int
    weights_dir: Path
    bucket_bytes: int
    gpus_per_engine: int
    engine_ranks: Callable[[str], Sequence[int]]
    on_gpu: bool
    multi_node: bool
    fp8: Fp8Format | None = None  # the engines serve FP8: updates are quantised to it
    timeout_s: float = DEFAULT_TIMEOUT_S  # trainer.collective_timeout_s
    ranks: Awaited = TRAIN_RANKS  # the train ranks as a fault names them (with their logs)


WEIGHT_SYNCS: dict[str, Callable[[SyncContext], WeightSync]] = {
    "disk": lambda c: DiskSync(
        c.client, c.call, c.num_ranks, c.weights_dir, c.fp8, c.timeout_s, c.ranks
    ),
    "tensor": lambda c: TensorSync(
        c.client,
        c.call,
        c.num_ranks,
        c.engine_ranks,
        c.bucket_bytes,
        c.fp8,
        c.timeout_s,
        c.ranks,
    ),
    "distributed": lambda c: DistributedSync(
        c.client,
        c.call,
        num_ranks=c.num_ranks,
        gpus_per_engine=c.gpus_per_engine,
        bucket_bytes=c.bucket_bytes,
        backend="nccl" if c.on_gpu else "gloo",
        multi_node=c.multi_node,
        timeout_s=c.timeout_s,
        fp8=c.fp8,
        ranks=c.ranks,
    ),
}


def on_trainer(actor: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """Runs inside a TrainActor (through Ray's `__ray_call__`): `fn(its trainer, *args)`."""
    return fn(actor.trainer, *args)


# ---- around every push ------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeSettings:
    """engine.weight_probe: a short generation whose logprobs the trainer recomputes."""

    prompt_ids: tuple[int, ...]
    temperature: float
    tolerance: float
    max_new_tokens: int = 16
    seed: int = 0


LogprobFn = Callable[[list[int], list[int]], Awaitable[list[float]]]
"""`reference(prompt_ids, output_ids)`: the trainer's logprobs of output_ids."""


async def probe_weights(
    client: EngineClient, worker_urls: Sequence[str], reference: LogprobFn, probe: ProbeSettings
) -> dict[str, float]:
    """Mean absolute logprob difference (trainer vs engine) per engine; raises
    WeightSyncError when one exceeds the tolerance."""
    params = {
        "max_new_tokens": probe.max_new_tokens,
        "temperature": probe.temperature,
        "top_p": 1.0,
        "top_k": -1,
        **NEUTRAL_SAMPLING,
        "sampling_seed": probe.seed,
    }
    prompt = list(probe.prompt_ids)
    results = await asyncio.gather(*(client.generate_on(u, prompt, params) for u in worker_urls))
    gaps: dict[str, float] = {}
    for url, result in zip(worker_urls, results, strict=True):
        if not result.output_ids:
            raise WeightSyncError(f"the probe generated nothing on {url}")
        expected = await reference(prompt, result.output_ids)
        diffs = [abs(a - b) for a, b in zip(expected, result.output_logprobs, strict=True)]
        gaps[url] = sum(diffs) / len(diffs)
    bad = {url: gap for url, gap in gaps.items() if gap > probe.tolerance}
    if bad:
        raise WeightSyncError(
            f"after the weight update, engines disagree with the trainer on the probe prompt: "
            f"mean |logprob difference| {bad} > engine.weight_probe_tolerance="
            f"{probe.tolerance}. The engines may serve other weights than the trainer holds "
            f"(a failed or partial update, or a name mapping that drops tensors)."
        )
    return gaps


async def verify_versions(client: EngineClient, worker_urls: Sequence[str], version: int) -> None:
    versions = await asyncio.gather(*(client.get_weight_version(u) for u in worker_urls))
    stale = {u: v for u, v in zip(worker_urls, versions, strict=True) if v != str(version)}
    if stale:
        raise WeightSyncError(f"engines did not switch to weight version {version}: {stale}")


async def update_engines(
    client: EngineClient,
    sync: WeightSync,
    worker_urls: Sequence[str],
    version: int,
) -> None:
    """Pause, flush, push, check every engine's version, resume (also after a failure)."""
    urls = list(worker_urls)
    await client.pause("abort", urls)
    try:
        await client.flush_cache(urls)
        await sync.push(version, urls)
        await verify_versions(client, urls, version)
    except BaseException as exc:
        # Resume what can be resumed; the update's own failure is what gets reported.
        with contextlib.suppress(Exception):
            await client.continue_generation(urls)
        if isinstance(exc, EngineRequestError):
            raise WeightSyncError(f"weight update to version {version} failed: {exc}") from exc
        raise
    await client.continue_generation(urls)
