"""A checkpoint's policy: restored exactly into a trainer, and exported to an HF folder that
transformers loads and that scores tokens like the trainer does."""

from __future__ import annotations

import importlib.util
import random
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlpost.backends.torch_trainer import TorchTrainer
from rlpost.runtime import checkpoint
from rlpost.runtime.run_state import (
    LoopState,
    SavedGroups,
    load_rank_state,
    save_rank_state,
    write_driver_state,
)
from rlpost.schema import AlgoConfig, OptimConfig, TrainConfig
from rlpost.types import TrainSample

REPO = Path(__file__).resolve().parents[3]


def load_tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def make_trainer(model_dir: Path) -> TorchTrainer:
    return TorchTrainer(
        model_dir,
        AlgoConfig(),
        OptimConfig(lr=1e-2),
        TrainConfig(global_batch_size=4),
        num_threads=1,
    )


def batch(seed: int) -> list[TrainSample]:
    rng = random.Random(seed)
    return [
        TrainSample(
            tokens=[rng.randrange(3, 250) for _ in range(12)],
            response_length=6,
            reward=float(i % 2),
        )
        for i in range(4)
    ]


def save_checkpoint(run_dir: Path, trainer: TorchTrainer, model_dir: Path) -> Path:
    staging = checkpoint.start_save(run_dir, 1)
    save_rank_state(trainer, str(staging), 0, with_optimizer=True)
    config = f"model:\n  hf_checkpoint: {model_dir}\n  load: null\n"
    write_driver_state(
        staging, LoopState(1, {"epoch": 0, "offset": 4, "seed": 1}), SavedGroups(), config, "{}\n"
    )
    return checkpoint.commit_save(staging, keep_last=2)


@pytest.fixture(scope="module")
def trained(tiny_lm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A trainer after one step on random rewards, saved; (checkpoint, run dir)."""
    trainer = make_trainer(tiny_lm_dir)
    trainer.train_step(batch(0))
    run_dir = tmp_path_factory.mktemp("run")
    return save_checkpoint(run_dir, trainer, tiny_lm_dir), run_dir


def test_restored_trainer_continues_exactly(tiny_lm_dir: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    reference = make_trainer(tiny_lm_dir)
    reference.train_step(batch(0))
    path = save_checkpoint(tmp_path, reference, tiny_lm_dir)
    expected = reference.train_step(batch(1))
    restored = make_trainer(tiny_lm_dir)
    assert load_rank_state(restored, str(path), 0)
    got = restored.train_step(batch(1))
    keys = ("train/loss", "train/grad_norm", "train/entropy", "train/lr")
    assert {k: got[k] for k in keys} == {k: expected[k] for k in keys}
    for a, b in zip(reference.model.parameters(), restored.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert restored.step == reference.step == 2


def test_exported_policy_loads_and_gives_the_trainers_logprobs(
    trained: tuple[Path, Path], tiny_lm_dir: Path, tmp_path: Path
) -> None:
    path, run_dir = trained
    out = tmp_path / "policy"
    assert load_tool("export_hf").main([str(run_dir), str(out)]) == 0  # the newest checkpoint
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    trainer = make_trainer(tiny_lm_dir)
    load_rank_state(trainer, str(path), 0)
    samples = batch(7)
    expected = trainer.compute_logprobs(samples)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    model.train(False)
    for sample, want in zip(samples, expected, strict=True):
        ids = torch.tensor([sample.tokens])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
        targets = ids[0, 1:]
        got = logp.gather(-1, targets[:, None])[:, 0][-sample.response_length :]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_export_refuses_a_corrupted_checkpoint(
    trained: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = trained
    broken = tmp_path / "rollout_1"
    shutil.copytree(path, broken)
    (broken / "trainer" / "__0_0.distcp").write_bytes(b"garbage")  # rank 0's shards
    assert load_tool("export_hf").main([str(broken), str(tmp_path / "out")]) == 2
    assert "bytes, the manifest says" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_export_of_a_run_directory_that_is_not_there_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert load_tool("export_hf").main([str(tmp_path / "nope"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "nope: does not exist" in err and "ckpt/" not in err.split("give")[0]
    assert not (tmp_path / "out").exists()


def test_export_refuses_to_replace_a_folder_that_is_not_an_export(
    trained: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, run_dir = trained
    kept = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    # the run directory itself as the output: replacing it would delete every checkpoint
    assert load_tool("export_hf").main([str(run_dir), str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert f"out_dir = '{run_dir}'" in err and "no config.json" in err and "ckpt" in err
    assert "fix: give a new folder" in err and "Traceback" not in err
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == kept
    # an earlier export is replaced, and so is an empty folder
    out = tmp_path / "policy"
    out.mkdir()
    assert load_tool("export_hf").main([str(run_dir), str(out)]) == 0
    assert load_tool("export_hf").main([str(run_dir), str(out)]) == 0
    assert (out / "config.json").is_file()


def test_export_refuses_a_base_model_of_another_architecture(
    tiny_lm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    from rlpost.config.loader import compose_run_config

    run, _ = compose_run_config(["model=qwen3-tiny"])
    fields = run.model.model_dump(mode="json") | {"num_layers": 2, "hidden_size": 64}
    trainer = make_trainer(tiny_lm_dir)
    staging = checkpoint.start_save(tmp_path / "run", 1)
    save_rank_state(trainer, str(staging), 0, with_optimizer=False)
    config = yaml.safe_dump({"model": fields | {"hf_checkpoint": str(tiny_lm_dir)}})
    state = LoopState(1, {"epoch": 0, "offset": 4, "seed": 1})
    write_driver_state(staging, state, SavedGroups(), config, "{}\n")
    saved = checkpoint.commit_save(staging, keep_last=2)
    other = REPO / "rlpost" / "assets" / "qwen3-tiny"  # 4 layers of 256
    out = tmp_path / "policy"
    assert load_tool("export_hf").main([str(saved), str(out), "--base-model", str(other)]) == 2
    err = capsys.readouterr().err
    assert f"--base-model = '{other}'" in err and "num_layers=2 there" in err
    assert "num_hidden_layers=4 here" in err and "fix: pass --base-model" in err
    assert not out.exists()
