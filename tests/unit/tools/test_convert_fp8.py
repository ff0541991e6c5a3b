"""tools/convert_hf_to_fp8.py: an HF folder converted shard by shard, read back by rlpost's
engine and trainers as the dequantised weights, refused when already FP8, and in memory
bounded by a shard rather than the model."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from rlpost.backends.fp8 import FP8_DTYPE, SCALE_SUFFIX, Fp8Format
from rlpost.backends.fp8_convert import convert_folder
from rlpost.backends.fp8_format import folder_format
from rlpost.backends.hf_load import build_causal_lm, load_causal_lm
from rlpost.backends.megatron.hf_files import HFCheckpoint, write_config

ROOT = Path(__file__).resolve().parents[3]
TOOL = ROOT / "tools" / "convert_hf_to_fp8.py"
BLOCK = Fp8Format((32, 32))


@pytest.fixture(scope="module")
def sharded_lm(tiny_lm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model saved in several shards (with an index), tokenizer beside it."""
    out = tmp_path_factory.mktemp("sharded_lm")
    shutil.copytree(tiny_lm_dir, out, dirs_exist_ok=True)
    for old in out.glob("*.safetensors"):
        old.unlink()
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_dir, dtype=torch.float32)
    model.save_pretrained(out, max_shard_size="100KB")
    assert len(list(out.glob("*.safetensors"))) > 2
    return out


@pytest.fixture(scope="module")
def fp8_lm(sharded_lm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert_folder(sharded_lm, tmp_path_factory.mktemp("fp8") / "lm", BLOCK)


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            out.update({name: handle.get_tensor(name) for name in handle.keys()})  # noqa: SIM118
    return out


def reference_dequantised(stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weight x scale, block by block, written out longhand (independent of rlpost's code)."""
    out = {}
    for name, tensor in stored.items():
        if name.endswith(SCALE_SUFFIX):
            continue
        if tensor.dtype != FP8_DTYPE:
            out[name] = tensor
            continue
        scale, weight = stored[name + SCALE_SUFFIX], tensor.float()
        for i in range(scale.shape[0]):
            for j in range(scale.shape[1]):
                weight[i * 32 : (i + 1) * 32, j * 32 : (j + 1) * 32] *= scale[i, j]
        out[name] = weight
    return out


def logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.tensor([[3, 17, 29, 41, 5, 8, 13]])
    with torch.no_grad():
        return model(ids).logits


def test_the_converted_folder_has_fp8_linears_scales_an_index_and_the_side_files(
    sharded_lm: Path, fp8_lm: Path
) -> None:
    source, stored = tensors(sharded_lm), tensors(fp8_lm)
    # shard for shard, same names
    assert sorted(p.name for p in fp8_lm.glob("*.safetensors")) == sorted(
        p.name for p in sharded_lm.glob("*.safetensors")
    )
    for name, tensor in source.items():
        if tensor.ndim == 2 and "embed" not in name:
            assert stored[name].dtype == FP8_DTYPE, name
            grid = [math.ceil(tensor.shape[0] / 32), math.ceil(tensor.shape[1] / 32)]
            assert list(stored[name + SCALE_SUFFIX].shape) == grid
            assert stored[name + SCALE_SUFFIX].dtype == torch.float32
        else:  # norms and the (tied) embedding stay as they were
            assert torch.equal(stored[name], tensor), name
    index = json.loads((fp8_lm / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(stored)
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in stored.values()
    )
    config = json.loads((fp8_lm / "config.json").read_text())
    assert config["quantization_config"] == {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        "weight_block_size": [32, 32],
    }  # fmt: skip
    assert folder_format(fp8_lm) == BLOCK
    for side in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (fp8_lm / side).read_bytes() == (sharded_lm / side).read_bytes()


def test_an_fp8_folder_builds_on_the_meta_device_as_it_loads(fp8_lm: Path) -> None:
    """The torch trainer's ranks other than 0 build the model from the folder's config alone:
    the same config as the loaded model's, quantisation left out, no weights read."""
    loaded = load_causal_lm(fp8_lm, torch.float32)
    with torch.device("meta"):
        built = build_causal_lm(fp8_lm, torch.float32)
    assert built.config.to_dict() == loaded.config.to_dict()
    assert "quantization_config" not in built.config.to_dict()
    assert built.generation_config.to_dict() == loaded.generation_config.to_dict()
    assert all(p.is_meta for p in built.parameters())


def test_rlpost_reads_the_fp8_folder_as_its_dequantised_weights(
    sharded_lm: Path, fp8_lm: Path
) -> None:
    expected = reference_dequantised(tensors(fp8_lm))
    reference = AutoModelForCausalLM.from_pretrained(sharded_lm, dtype=torch.float32)
    reference.load_state_dict(expected, strict=False)
    # the engine's and the torch trainer's loader
    model = load_causal_lm(fp8_lm, torch.float32)
    assert "quantization_config" not in model.config.to_dict()
    assert torch.allclose(logits(model), logits(reference), atol=1e-6)
    # quantisation moved the weights (and the logits) a little, as FP8 does
    original = AutoModelForCausalLM.from_pretrained(sharded_lm, dtype=torch.float32)
    gap = float((logits(model) - logits(original)).abs().max())
    assert 0 < gap < 0.1 * float(logits(original).abs().max())
    # the megatron conversion's reader: the same weights, the scales not listed
    ckpt = HFCheckpoint(fp8_lm)
    try:
        assert sorted(ckpt.names()) == sorted(expected)
        for name, weight in expected.items():
            assert torch.allclose(ckpt.get(name).float(), weight.float(), atol=0), name
    finally:
        ckpt.close()


def test_an_export_beside_an_fp8_checkpoint_is_not_labelled_fp8(
    fp8_lm: Path, tmp_path: Path
) -> None:
    write_config(fp8_lm, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert "quantization_config" not in config and config["hidden_size"] == 64


def test_workers_in_parallel_write_the_same_files(
    sharded_lm: Path, fp8_lm: Path, tmp_path: Path
) -> None:
    parallel = convert_folder(sharded_lm, tmp_path / "parallel", BLOCK, max_workers=2)
    for file in fp8_lm.iterdir():
        assert (parallel / file.name).read_bytes() == file.read_bytes(), file.name


def test_the_tool_refuses_a_folder_that_is_already_fp8(fp8_lm: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(TOOL), "--model-dir", str(fp8_lm), "--save-dir", str(tmp_path / "x")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "already quantised" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x").exists()


def test_the_tool_converts_with_the_seeds_flags(sharded_lm: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable, str(TOOL), "--model-dir", str(sharded_lm),
            "--save-dir", str(tmp_path / "out"), "--strategy", "channel", "--max-workers", "1",
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert folder_format(tmp_path / "out") == Fp8Format(None)
    stored = tensors(tmp_path / "out")
    up = "model.layers.0.mlp.up_proj.weight"
    assert list(stored[up + SCALE_SUFFIX].shape) == [stored[up].shape[0], 1]


# the tool, run as `python tools/convert_hf_to_fp8.py`, twice in one process: on a one-shard
# model (loading every library and kernel it uses), then on the model measured; printed: the
# most resident memory seen during the second run (sampled every 2 ms) over that before it
ADDED_RSS = """
import resource, runpy, sys, threading, time

def convert(model_dir, save_dir):
    sys.argv = [tool, "--model-dir", model_dir, "--save-dir", save_dir]
    try:
        runpy.run_path(tool, run_name="__main__")
    except SystemExit as done:
        assert done.code == 0, done.code

def resident():
    return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()

tool, warm_up, model_dir, save_dir = sys.argv[1:]
convert(warm_up, save_dir + ".warm")
before, peak, running = resident(), [0], True

def sample():
    while running:
        peak[0] = max(peak[0], resident())
        time.sleep(0.002)

sampler = threading.Thread(target=sample)
sampler.start()
convert(model_dir, save_dir)
running = False
sampler.join()
print(peak[0] - before)
"""
SHARD_BYTES = 2048 * 2048 * 4


def big_checkpoint(folder: Path, shards: int, rows: int = 2048) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    weight_map = {}
    for i in range(shards):
        name, file = f"model.layers.{i}.mlp.up_proj.weight", f"model-{i:05d}.safetensors"
        save_file({name: torch.randn(rows, 2048)}, str(folder / file))
        weight_map[name] = file
    index = {"metadata": {"total_size": shards * SHARD_BYTES}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def added_rss(warm_up: Path, model_dir: Path, out: Path) -> int:
    done = subprocess.run(
        [sys.executable, "-c", ADDED_RSS, str(TOOL), str(warm_up), str(model_dir), str(out)],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return int(done.stdout.split()[-1])


def test_converter_memory_is_bounded_by_a_shard_not_the_model(tmp_path: Path) -> None:
    warm_up = big_checkpoint(tmp_path / "warm_up", 1, rows=128)
    two, eight = big_checkpoint(tmp_path / "two", 2), big_checkpoint(tmp_path / "eight", 8)
    os.sync()  # pages still being written back would count as the reader's while it maps them
    small = added_rss(warm_up, two, tmp_path / "two_fp8")
    large = added_rss(warm_up, eight, tmp_path / "eight_fp8")
    # a 128 MiB model converts in a few 16 MiB shards' worth of memory, and six more shards
    # (96 MiB more model) cost less than one more shard
    assert large < 4 * SHARD_BYTES and large - small < SHARD_BYTES, (small, large)
    assert len(list((tmp_path / "eight_fp8").glob("*.safetensors"))) == 8


def test_the_tool_refuses_to_replace_a_folder_that_is_not_a_model(
    sharded_lm: Path, tmp_path: Path
) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "results.md").write_text("kept")
    done = subprocess.run(
        [sys.executable, str(TOOL), "--model-dir", str(sharded_lm), "--save-dir", str(notes)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    assert f"--save-dir = '{notes}'" in done.stderr and "results.md" in done.stderr
    assert "Traceback" not in done.stderr
    assert [p.name for p in notes.iterdir()] == ["results.md"]
