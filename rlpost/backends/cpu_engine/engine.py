"""The CPU engine without HTTP: a transformers causal LM, its tokenizer, the scheduler, and
the weight-management calls. Thread-safe; every model access runs on the decoding thread."""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from rlpost.backends.cpu_engine.generator import BatchGenerator
from rlpost.backends.cpu_engine.protocol import GenerateRequest, RowOutput
from rlpost.backends.cpu_engine.row import Row
from rlpost.backends.cpu_engine.sampling import RequestError
from rlpost.backends.cpu_engine.scheduler import Load, Scheduler
from rlpost.backends.cpu_engine.weights import ModelWeights, read_weights
from rlpost.backends.fp8 import FP8_DTYPE, SCALE_SUFFIX, dequantize_state, folder_format
from rlpost.backends.hf_load import load_causal_lm
from rlpost.backends.sglang.buckets import WeightInfo
from rlpost.backends.vector_math import warm_vector_math

logger = logging.getLogger(__name__)

MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")


@dataclass(frozen=True)
class EngineSettings:
    """How one CPU engine runs; `seed` makes unseeded sampling reproducible per request order."""

    model_path: str
    seed: int = 0
    max_batch_size: int = 64
    batch_wait_s: float = 0.005
    num_threads: int | None = None
    weight_version: str = "default"


class CpuEngine:
    """Loads the model (fp32, CPU) and serves generation and weight updates."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        if settings.num_threads is not None:
            torch.set_num_threads(settings.num_threads)
        warm_vector_math()
        torch.manual_seed(settings.seed)
        path = Path(settings.model_path)
        if not (path / "config.json").is_file():
            raise ValueError(
                f"model_path '{path}' is not a Hugging Face model folder (no config.json); "
                f"the CPU engine loads local folders only"
            )
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        # an FP8 checkpoint is served dequantised: the weights it stands for, rounded as
        # FP8 rounds them (and so is every update: see receive_weights)
        self.fp8 = folder_format(path)
        self.model = load_causal_lm(path, torch.float32)
        self.model.train(False)
        self.weights = ModelWeights(self.model)
        self.weights_path = str(path)
        self.context_len = getattr(self.model.config, "max_position_embeddings", None)
        self.generator = BatchGenerator(self.model, self._eos_ids(), self.decode)
        self.generator.weight_version = settings.weight_version
        self.scheduler = Scheduler(self.generator, settings.max_batch_size, settings.batch_wait_s)
        self._row_counter = itertools.count()
        self._lock = threading.Lock()
        self._update_groups: dict[str, Any] = {}
        self._fp8_waiting: dict[str, torch.Tensor] = {}
        self.scheduler.start()

    def _eos_ids(self) -> list[int]:
        ids: set[int] = set()
        sources: list[Any] = [self.tokenizer.eos_token_id, self.model.config.eos_token_id]
        if self.model.generation_config is not None:
            sources.append(self.model.generation_config.eos_token_id)
        for value in sources:
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list | tuple):
                ids.update(int(v) for v in value)
        return sorted(ids)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    @property
    def weight_version(self) -> str:
        return self.generator.weight_version

    def make_rows(self, request: GenerateRequest) -> list[Row]:
        """Rows for a request. Each row samples from its own generator: seeded by
        sampling_seed (offset by the sample index when n > 1), else by the engine seed and
        the row's arrival number."""
        if self.weights.released:
            raise RequestError(
                "the weights are released; call /resume_memory_occupation first", status=503
            )
        rows = []
        seed = request.params.sampling_seed
        for index, (prompt, rid) in enumerate(zip(request.prompts, request.rids, strict=True)):
            generator = torch.Generator()
            with self._lock:
                serial = next(self._row_counter)
            sample_index = index % request.params.n
            if seed is not None:
                generator.manual_seed(seed + sample_index)
            else:
                generator.manual_seed(self.settings.seed * 1_000_003 + serial)
            rows.append(Row(rid=rid, prompt_ids=prompt, params=request.params, generator=generator))
        return rows

    def submit(self, rows: list[Row]) -> None:
        self.scheduler.submit(rows)

    @staticmethod
    def output_of(row: Row) -> RowOutput:
        assert row.finish is not None, "only finished rows have an output"
        return RowOutput(
            rid=row.rid,
            prompt_len=len(row.prompt_ids),
            output_ids=list(row.output_ids),
            logprobs=list(row.logprobs),
            finish_reason=row.finish.to_json(),
            weight_version=row.weight_version,
        )

    def update_weights_from_disk(
        self, model_path: str, weight_version: str | None
    ) -> concurrent.futures.Future[None]:
        """Load a safetensors folder into the live model at the next safe point."""

        def load() -> None:
            state = read_weights(model_path, torch.float32)
            self.weights.assign(state)
            self.weights_path = model_path
            if weight_version is not None:
                self.generator.weight_version = weight_version
            logger.info("loaded weights from %s (version %s)", model_path, self.weight_version)

        return self.scheduler.call(load)

    def join_update_group(
        self, address: tuple[str, int], rank: int, world_size: int, name: str, backend: str
    ) -> None:
        """Join a weight-update group as `rank` (blocks until every rank has joined)."""
        from rlpost.backends.sglang.update_group import init_update_group

        if backend != "gloo":
            raise RequestError(
                f"the CPU engine joins weight-update groups over gloo, not {backend}"
            )
        self._update_groups[name] = init_update_group(
            address[0], address[1], rank, world_size, name, backend
        )

    def receive_weights(
        self, infos: Sequence[WeightInfo], name: str, weight_version: str | None
    ) -> concurrent.futures.Future[None]:
        """Receive one broadcast bucket (blocking, on the caller's thread), then load it into
        the live model at the next safe point."""
        from rlpost.backends.sglang.update_group import receive_weights

        group = self._update_groups.get(name)
        if group is None:
            raise RequestError(f"no weight-update group named '{name}'; init it first")
        state = self._dequantized(dict(receive_weights(infos, group)), weight_version)

        def load() -> None:
            # the version comes with the update's last bucket (or in set_weight_version)
            self.weights.assign_some(state, last=weight_version is not None)
            if weight_version is not None:
                self.generator.weight_version = weight_version

        return self.scheduler.call(load)

    def _dequantized(
        self, received: dict[str, torch.Tensor], weight_version: str | None
    ) -> dict[str, torch.Tensor]:
        """An FP8 update's weights dequantised. A weight and its scales travel in buckets of
        their own dtype, so one may wait here for the other; by the end of the update (a
        bucket that carries the version, or the version's own call) nothing may wait."""
        if self.fp8 is None:
            if any(t.dtype == FP8_DTYPE for t in received.values()):
                raise RequestError("FP8 weights sent to an engine serving an unquantised model")
            return received
        waiting = {**self._fp8_waiting, **received}
        pairs = {n for n, t in waiting.items() if t.dtype == FP8_DTYPE}
        complete = {n for n in pairs if n + SCALE_SUFFIX in waiting}
        held = (pairs - complete) | {
            n
            for n in waiting
            if n.endswith(SCALE_SUFFIX) and n.removesuffix(SCALE_SUFFIX) not in waiting
        }
        self._fp8_waiting = {n: waiting[n] for n in held}
        if weight_version is not None and held:
            self._fp8_waiting = {}
            raise RequestError(
                f"the update ended with {len(held)} FP8 weight(s) or scale(s) unmatched, e.g. "
                f"{sorted(held)[:2]}"
            )
        ready = {n: t for n, t in waiting.items() if n not in held}
        return dequantize_state(ready, self.fp8, torch.float32)

    def leave_update_group(self, name: str) -> None:
        from rlpost.backends.sglang.update_group import destroy_update_group

        group = self._update_groups.pop(name, None)
        if group is None:
            raise RequestError(f"no weight-update group named '{name}'")
        destroy_update_group(group)

    def set_weight_version(self, version: str) -> concurrent.futures.Future[None]:
        """Serve `version` from now on: the end of a bucketed update, so an FP8 weight still
        waiting for its scale (or a scale for its weight) means the update was incomplete."""
        held, self._fp8_waiting = sorted(self._fp8_waiting), {}
        if held:
            raise RequestError(
                f"the update ended with {len(held)} FP8 weight(s) or scale(s) unmatched, e.g. "
                f"{held[:2]}"
            )

        def apply() -> None:
            self.weights.finish_update()
            self.generator.weight_version = version

        return self.scheduler.call(apply)

    def release_memory(self, tags: Sequence[str]) -> concurrent.futures.Future[None]:
        """Drop the weights (tag "weights"); KV caches live only inside a batch on CPU."""
        self._check_tags(tags)

        def release() -> None:
            self._require_idle("release memory")
            if "weights" in tags and not self.weights.released:
                self.weights.release()

        return self.scheduler.call(release)

    def resume_memory(self, tags: Sequence[str]) -> concurrent.futures.Future[None]:
        """Reload the weights from the folder they were last loaded from."""
        self._check_tags(tags)

        def resume() -> None:
            if "weights" in tags and self.weights.released:
                self.weights.assign(read_weights(self.weights_path, torch.float32))

        return self.scheduler.call(resume)

    def _check_tags(self, tags: Sequence[str]) -> None:
        unknown = [t for t in tags if t not in MEMORY_TAGS]
        if unknown:
            raise RequestError(f"unknown memory tag(s) {unknown}; known: {list(MEMORY_TAGS)}")

    def _require_idle(self, action: str) -> None:
        load = self.scheduler.load()
        if load.num_running or load.num_waiting:
            raise RequestError(
                f"cannot {action} while {load.num_running + load.num_waiting} requests run; "
                f"pause_generation first"
            )

    def load(self) -> Load:
        return self.scheduler.load()

    def model_info(self) -> dict[str, Any]:
        config = self.model.config
        return {
            "model_path": self.settings.model_path,
            "tokenizer_path": self.settings.model_path,
            "is_generation": True,
            "weight_version": self.weight_version,
            "model_type": getattr(config, "model_type", None),
            "architectures": getattr(config, "architectures", None),
            "context_length": self.context_len,
            "num_parameters": sum(p.numel() for p in self.model.parameters()),
            "weights_path": self.weights_path,
        }

    def shutdown(self) -> None:
        self.scheduler.stop()
