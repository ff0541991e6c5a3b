"""An engine killed in the middle of a rollout: the run goes on, the engine comes back at the
current weight version, and the rollout still has exactly one answer per sample.

A whole session on CPU (Ray, two train ranks, two CPU engines behind the real router, fault
tolerance on, engine memory released around training, the weight probe on); the engine
process is SIGKILLed while it is generating.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
import torch
import yaml
from transformers import Qwen3Config, Qwen3ForCausalLM

from rlpost.config.loader import compose_run_config
from rlpost.plan import build_plan
from rlpost.runtime.rollout.manager import Group, GroupRunner, SamplingSettings
from rlpost.runtime.session import Session
from rlpost.runtime.train_data import to_train_samples
from rlpost.types import Sample, SampleStatus

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]

GROUPS, PER_GROUP, MAX_NEW_TOKENS = 8, 4, 48
PROMPT = [40, 41, 42, 43, 44]


def save_qwen3_tiny(out: Path, tokenizer_dir: Path) -> Path:
    """Random weights in the shape conf/model/qwen3-tiny.yaml declares (so its checks pass)."""
    spec = yaml.safe_load((REPO / "conf" / "model" / "qwen3-tiny.yaml").read_text())
    config = Qwen3Config(
        vocab_size=spec["vocab_size"],
        hidden_size=spec["hidden_size"],
        intermediate_size=spec["ffn_hidden_size"],
        num_hidden_layers=spec["num_layers"],
        num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_query_groups"],
        head_dim=spec["kv_channels"],
        max_position_embeddings=spec["max_position_embeddings"],
        tie_word_embeddings=spec["tie_word_embeddings"],
        rope_theta=float(spec["rotary_base"]),
        rms_norm_eps=float(spec["norm_epsilon"]),
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(out)
    for item in tokenizer_dir.iterdir():
        if item.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            (out / item.name).write_bytes(item.read_bytes())
    return out


def fresh_groups() -> list[Group]:
    return [
        [
            Sample(group_index=g, index=i, prompt="", prompt_ids=[*PROMPT, 50 + g])
            for i in range(PER_GROUP)
        ]
        for g in range(GROUPS)
    ]


async def length_reward(samples: list[Sample]) -> list[float]:
    return [len(s.response_ids) / MAX_NEW_TOKENS for s in samples]


async def rollout(runner: GroupRunner, params: dict) -> list[Group]:
    groups = fresh_groups()
    return list(
        await asyncio.gather(*(runner.run(g, params, runner.client_for(g)) for g in groups))
    )


def check_rollout(groups: list[Group], version: str) -> None:
    samples = [s for g in groups for s in g]
    assert len(groups) == GROUPS
    keys = sorted((s.group_index, s.index) for s in samples)
    assert keys == [(g, i) for g in range(GROUPS) for i in range(PER_GROUP)]
    for s in samples:
        assert s.status in (SampleStatus.COMPLETED, SampleStatus.TRUNCATED), s.status
        # one answer per sample: a re-sent request never adds to a sample twice
        assert 0 < len(s.response_ids) <= MAX_NEW_TOKENS
        assert len(s.rollout_logprobs) == len(s.response_ids)
        assert s.weight_version == version
        assert s.reward is not None


def test_a_killed_engine_is_restarted_at_the_current_version_mid_rollout(
    tiny_lm_dir: Path, tmp_path: Path
) -> None:
    started = time.monotonic()
    model = save_qwen3_tiny(tmp_path / "model", tiny_lm_dir)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"input": "1+1", "label": "2"}\n')
    cfg, _ = compose_run_config(
        [
            f"model.hf_checkpoint={model}",
            f"recipe.data.prompt_data={prompts}",
            "recipe.eval.interval=null",
            f"recipe.rollout.batch_size={GROUPS}",
            f"recipe.rollout.n_samples_per_prompt={PER_GROUP}",
            f"recipe.train.global_batch_size={GROUPS * PER_GROUP}",
            "engine.fault_tolerance=true",
            "engine.health_check_interval_s=0.5",
            "engine.health_check_timeout_s=10",
            "engine.health_check_first_wait_s=0",
            # the colocated path on CPU engines too: memory released around training, and
            # the probe comparing trainer and engine logprobs after every push
            "engine.offload=true",
            "engine.weight_probe=true",
            f"run.dir={tmp_path / 'run'}",
        ]
    )
    plan = build_plan(cfg)
    params = SamplingSettings(max_new_tokens=MAX_NEW_TOKENS, temperature=1.0).to_sglang()

    async def scenario() -> float:
        async with Session(cfg, plan, tmp_path / "run") as session:
            assert session.client is not None and session.pool is not None
            pool, client = session.pool, session.client
            runner = GroupRunner(client, length_reward)
            await session.push_weights(version=1)
            victim = pool.urls[1]
            victim_pid = await pool.engines[1].pid()
            assert victim_pid is not None
            task = asyncio.create_task(rollout(runner, params))
            async with asyncio.timeout(60):
                while await client.num_requests([victim]) == 0:
                    await asyncio.sleep(0.01)
            os.kill(victim_pid, signal.SIGKILL)
            groups = await task
            async with asyncio.timeout(120):  # the rollout may finish before the restart
                while not pool.restarts:
                    await asyncio.sleep(0.1)
            check_rollout(groups, version="1")
            (restart,) = pool.restarts
            assert restart.index == 1
            assert await pool.engines[1].pid() != victim_pid
            assert await client.get_weight_version(pool.urls[1]) == "1"

            # the run goes on: train, push, and a rollout that both engines serve
            await session.train(to_train_samples(groups, cfg.recipe.algo), with_reference=False)
            await session.push_weights(version=2)
            served_before = await _served(client, pool.urls)
            check_rollout(await rollout(runner, params), "2")
            served_after = await _served(client, pool.urls)
            assert all(a > b for a, b in zip(served_after, served_before, strict=True))
            return restart.seconds

    seconds = asyncio.run(scenario())
    print(f"engine restart {seconds:.1f} s; test {time.monotonic() - started:.1f} s")


async def _served(client: object, urls: list[str]) -> list[int]:
    from rlpost.runtime.rollout.client import EngineClient

    assert isinstance(client, EngineClient)
    infos = [await client._call_ok("GET", f"{u}/server_info") for u in urls]
    return [int(i["internal_states"][0]["num_served_reqs"]) for i in infos]
