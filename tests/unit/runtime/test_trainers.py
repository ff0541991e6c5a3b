"""trainer_spec: what a run's train ranks build their trainers from is the run's sections and
the plan's decisions (the runtime and benchmarks/megatron_train.py both build from it)."""

from __future__ import annotations

from rlpost.config.loader import compose_run_config
from rlpost.plan import Plan, build_plan
from rlpost.runtime.trainers import TrainerSpec, trainer_spec
from rlpost.schema import RunConfig


def spec_for(*overrides: str) -> tuple[RunConfig, Plan, TrainerSpec]:
    cfg = compose_run_config(list(overrides))[0]
    plan = build_plan(cfg)
    spec = trainer_spec(cfg, plan, master_addr="10.0.0.1", master_port=29511, num_threads=3)
    return cfg, plan, spec


def test_the_torch_trainer_on_a_gpu_profile_computes_on_cuda_with_the_plans_decisions() -> None:
    cfg, plan, spec = spec_for(
        "model=qwen3-0.6b", "recipe=grpo_dapo", "hardware=h200x1", "trainer.backend=torch",
        "layout.train.fsdp.cpu_offload=true", "recipe.algo.kl_loss_coef=0.01",
    )  # fmt: skip
    assert (spec.backend, spec.device, spec.compute_dtype) == ("torch", "cuda", "bf16")
    assert spec.layout == plan.parallel and spec.world_size == plan.placement.train_gpus
    assert spec.fsdp is not None and spec.fsdp.cpu_offload
    assert spec.load_reference == plan.work.load_reference is True
    assert spec.reuse_old_logprobs == plan.work.reuse_old_logprobs
    assert spec.share_prompts == plan.work.share_prompts is True
    assert spec.prediction == plan.prediction
    assert (spec.master_addr, spec.master_port, spec.num_threads) == ("10.0.0.1", 29511, 3)
    assert spec.init_method is None
    assert (spec.seed, spec.collective_timeout_s) == (
        cfg.run.seed,
        cfg.trainer.collective_timeout_s,
    )
    assert spec.model == cfg.model and spec.algo == cfg.recipe.algo


def test_the_torch_trainer_computes_in_the_models_dtype_on_gpus_and_float32_on_cpu() -> None:
    on_gpu = ("model=qwen3-0.6b", "recipe=grpo_dapo", "hardware=h200x1", "trainer.backend=torch")
    assert spec_for(*on_gpu, "model.params_dtype=fp32")[2].compute_dtype == "fp32"
    _, _, spec = spec_for("hardware=cpu", "trainer.backend=torch", "model.params_dtype=bf16")
    assert (spec.device, spec.compute_dtype) == ("cpu", "fp32")


def test_the_cpu_profile_trains_on_the_cpu_and_megatron_packs_every_prompt() -> None:
    _, plan, spec = spec_for("hardware=cpu", "trainer.backend=megatron")
    assert (spec.backend, spec.device) == ("megatron", "cpu")
    assert spec.share_prompts is plan.work.share_prompts is False


def test_an_moe_models_routing_and_experts_reach_the_trainer() -> None:
    moe = ("model=qwen3-30b-a3b", "recipe=grpo_dapo", "hardware=h100x8", "trainer.backend=torch")
    _, _, spec = spec_for(*moe)
    assert (spec.router_dtype, spec.grouped_gemm) == ("fp32", True)
    _, _, spec = spec_for(*moe, "model.moe.grouped_gemm=false")
    assert spec.grouped_gemm is False
    _, _, dense = spec_for("hardware=cpu", "trainer.backend=torch")
    assert dense.grouped_gemm is None  # a dense model: transformers' default, no experts


def test_rank_zero_holds_the_ranks_meeting_port_from_its_pick_until_its_trainer_serves_it() -> None:
    """Ranks that meet over TCP (across nodes) meet at a port rank 0's actor binds the moment
    it picks it (`hold_rendezvous`), before any rank builds its trainer: a port picked free
    on the node and let go (as before) could be another process's by the time rank 0 bound
    it. The trainer's store then serves that same socket."""
    import dataclasses

    import psutil
    import torch

    from rlpost.backends.ports import is_port_free, take_held_port
    from rlpost.runtime.actors import TrainActor

    # megatron's one rank serves a TCP store too (the torch trainer's meets no one)
    _, _, spec = spec_for("trainer.backend=megatron", "layout.train.num_gpus=1")
    spec = dataclasses.replace(spec, master_addr="127.0.0.1", master_port=0)
    assert spec.world_size == 1
    assert spec.init_method is None
    threads = torch.get_num_threads()
    rank0 = TrainActor.__ray_actor_class__(spec, 0, {})  # the actor's class, in this process
    port = rank0.hold_rendezvous()
    assert rank0.trainer is None  # nothing built yet: the other ranks start after this
    assert not is_port_free(port, "127.0.0.1")  # what another process's bind now meets
    try:
        assert rank0.start() is True
        assert take_held_port("127.0.0.1", port) is None  # the trainer's store took it
        listening = {
            (c.laddr.ip, c.laddr.port)
            for c in psutil.Process().net_connections("inet")
            if c.status == psutil.CONN_LISTEN
        }
        assert ("127.0.0.1", port) in listening
        assert torch.distributed.is_initialized()  # its group, met at the held port
    finally:
        if rank0.trainer is not None:
            rank0.trainer.close()
        torch.set_num_threads(threads)
