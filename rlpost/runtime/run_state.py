"""What a checkpoint holds: the loop's position, the partial-rollout buffer, RNG states, and
each train rank's model and optimizer.

    rollout_<n>/
      loop.json          rollouts done, the data source's state (the jsonl source: epoch,
                         offset, seed), tracker run ids,
                         eval history, the trainer's backend and parallel grid
      buffer.pkl         groups waiting for a later rollout (pickled samples): the partial-rollout
                         buffer, prompts being generated (generated again, before any new
                         draw), and finished groups queued for the trainer
      rng/driver.pt      python and torch RNG of the driver
      rng/rank_<r>.pt    python and torch RNG of train rank r
      trainer/           model, optimizer and step, in the trainer backend's own format:
                         torch: a torch.distributed.checkpoint every rank writes its shards
                         of (__<r>_0.distcp, .metadata, trainer_state.json; it loads under
                         another DP size), or rank_0.pt from before sharding (rank 0's replica;
                         still loads); see rlpost.backends.torch_trainer.checkpoint;
                         megatron: a torch_dist checkpoint every rank writes its shards of
      config.yaml        the resolved config; provenance.json: overrides, git revision, packages
"""

from __future__ import annotations

import json
import pickle
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlpost.data.source import Group
from rlpost.runtime.checkpoint import write_synced

if TYPE_CHECKING:
    from rlpost.schema import ModelConfig

LOOP_FILE = "loop.json"
BUFFER_FILE = "buffer.pkl"
DRIVER_RNG_FILE = "rng/driver.pt"
CONFIG_FILE = "config.yaml"
PROVENANCE_FILE = "provenance.json"


TRAINER_DIR = "trainer"


def rank_rng_file(rank: int) -> str:
    return f"rng/rank_{rank}.pt"


@dataclass(frozen=True)
class LoopState:
    """Where the loop stands after `rollouts_done` rollouts; JSON in loop.json."""

    rollouts_done: int
    data: dict[str, Any]  # the data source's state_dict
    wandb_run_id: str | None = None
    tensorboard_step: int = 0
    eval_history: list[dict[str, Any]] = field(default_factory=list)
    trainer_backend: str = "torch"
    parallel: dict[str, Any] = field(default_factory=dict)
    train_ranks: int = 1
    optimizer_saved: bool = True
    # A SIGTERM's save after a rollout trained, or the save before a failed evaluation ends
    # the run: what the resumed run does for that rollout first (its evaluation and HF
    # export when due; rlpost.runtime.loop.Unfinished, whose `left_by` says which).
    unfinished: dict[str, Any] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> LoopState:
        return cls(**json.loads(text))


def left_by(unfinished: dict[str, Any]) -> str:
    """What left a checkpoint's `unfinished` rollout, for a message: "the stop", "the failed
    evaluation", or, in a checkpoint that does not say (saved before it was recorded), "the
    last launch"."""
    return LEFT_BY.get(str(unfinished.get("left_by")), "the last launch")


LEFT_BY = {"stop": "the stop", "evaluation": "the failed evaluation"}


# ---- RNG ----------------------------------------------------------------------------------


def capture_rng() -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _save_torch(obj: Any, path: Path) -> None:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    write_synced(path, buffer.getvalue())


def _load_torch(path: Path) -> Any:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


# ---- the driver's part --------------------------------------------------------------------


@dataclass(frozen=True)
class SavedGroups:
    """Groups a checkpoint keeps: `buffer` is drawn before fresh prompts (partial rollouts,
    prompts put back); `queued` are finished groups the trainer takes first; `generating`
    were being generated (or had failed) and are generated again, as drawn, before any new
    draw (checkpoints before it: in `buffer`)."""

    buffer: list[Group] = field(default_factory=list)
    queued: list[Group] = field(default_factory=list)
    generating: list[Group] = field(default_factory=list)


def write_driver_state(
    staging: Path, state: LoopState, groups: SavedGroups, config_yaml: str, provenance: str
) -> None:
    payload = {"buffer": groups.buffer, "queued": groups.queued, "generating": groups.generating}
    write_synced(staging / LOOP_FILE, state.to_json().encode())
    write_synced(staging / BUFFER_FILE, pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
    write_synced(staging / CONFIG_FILE, config_yaml.encode())
    write_synced(staging / PROVENANCE_FILE, provenance.encode())
    _save_torch(capture_rng(), staging / DRIVER_RNG_FILE)


def read_loop_state(path: Path) -> LoopState:
    return LoopState.from_json((path / LOOP_FILE).read_text(encoding="utf-8"))


def read_groups(path: Path) -> SavedGroups:
    # Only read from a checkpoint whose manifest hashes were verified: our own bytes.
    saved = pickle.loads((path / BUFFER_FILE).read_bytes())
    if isinstance(saved, list):  # checkpoints before the async loops: the buffer alone
        return SavedGroups(buffer=saved)
    return SavedGroups(
        buffer=saved["buffer"], queued=saved["queued"], generating=saved.get("generating", [])
    )


def restore_driver_rng(path: Path) -> None:
    restore_rng(_load_torch(path / DRIVER_RNG_FILE))


# ---- each train rank's part (in the rank's process, given its trainer) --------------------


def save_rank_state(trainer: Any, staging: str, rank: int, with_optimizer: bool) -> None:
    """This rank's part of the trainer's state (a collective save for sharded trainers),
    and its RNG."""
    root = Path(staging)
    trainer.save_checkpoint(root / TRAINER_DIR, with_optimizer)
    _save_torch(capture_rng(), root / rank_rng_file(rank))


def load_rank_state(trainer: Any, checkpoint: str, rank: int) -> bool:
    """Load the trainer's state into this rank, and this rank's RNG when saved.

    Returns whether an RNG state was found for this rank (not when the run has more ranks
    than the saved one).
    """
    root = Path(checkpoint)
    trainer.load_checkpoint(root / TRAINER_DIR)
    rng_path = root / rank_rng_file(rank)
    if rng_path.is_file():
        restore_rng(_load_torch(rng_path))
        return True
    return False


def use_deterministic_algorithms(actor: Any) -> None:
    """Deterministic kernels in this process (a rank's actor, or the driver with None)."""
    import torch

    torch.use_deterministic_algorithms(True)


# ---- the policy of a saved checkpoint as an HF folder -------------------------------------


def _saved_config(checkpoint: Path) -> dict[str, Any]:
    import yaml

    config: dict[str, Any] = yaml.safe_load((checkpoint / CONFIG_FILE).read_text(encoding="utf-8"))
    return config


def saved_model_config(checkpoint: Path, base: Path) -> ModelConfig:
    """The model the checkpoint's run trained, with `base` as its HF folder."""
    from rlpost.schema import ModelConfig

    return ModelConfig(**(_saved_config(checkpoint)["model"] | {"hf_checkpoint": str(base)}))


def base_model_dir(checkpoint: Path) -> Path:
    """The HF folder the run's trainer started from (its config and tokenizer files)."""
    model = _saved_config(checkpoint)["model"]
    if read_loop_state(checkpoint).trainer_backend == "megatron":
        return Path(model["hf_checkpoint"])  # model.load is a torch_dist checkpoint there
    return Path(model.get("load") or model["hf_checkpoint"])


def export_checkpoint_hf(checkpoint: Path, out_dir: Path, base_model: Path | None = None) -> Path:
    """Write a verified checkpoint's policy to `out_dir` as an HF folder.

    The architecture, tokenizer and generation files come from `base_model` (default: the
    run's HF model folder); the weights from the checkpoint's trainer state, in either
    backend's format.
    """
    from rlpost.runtime.checkpoint import verify

    verify(checkpoint)
    base = base_model or base_model_dir(checkpoint)
    if read_loop_state(checkpoint).trainer_backend == "megatron":
        from rlpost.backends.megatron import silence_known_warnings

        silence_known_warnings()
        from rlpost.backends.megatron.conversion import torch_dist_to_hf

        config = saved_model_config(checkpoint, base)
        return torch_dist_to_hf(config, checkpoint / TRAINER_DIR, out_dir)
    from rlpost.backends.torch_trainer.checkpoint import read_full_model_state
    from rlpost.backends.torch_trainer.model_io import export_hf, load_causal_lm

    model = load_causal_lm(base)
    model.load_state_dict(read_full_model_state(checkpoint / TRAINER_DIR))
    return export_hf(model, base, out_dir)
