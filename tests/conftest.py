"""Shared test assets: a tiny random Qwen3 with a byte-level BPE tokenizer, and a tiny random
Mistral (a family megatron-core has no spec for) with the shipped tiny tokenizer, saved locally.

torch, tokenizers and transformers are imported when an asset is built, not at collection:
the config and plan tests never load them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# torch.cuda.is_available() (the gpu skip conditions) asks NVML instead of initialising the
# CUDA driver in the pytest process, so ranks forked later can still use their GPU.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast


REAL_LOOP = "tests/integration/"
# real-loop tests that share a module-scoped launch (or cluster) run as one unit, so it starts
# once; every other real-loop test is a unit of its own. A test missing here only costs time:
# its module's fixture then starts again on whichever worker runs it (tests/test_scheduler.py
# checks that every test taking a listed fixture is listed).
SHARED_LAUNCH = {
    "tests/integration/test_megatron_loop.py": "runs",
    "tests/integration/test_multi_turn.py": "launches",
    "tests/integration/test_multi_node.py": "cluster",
    "tests/integration/test_reward_model_actor.py": "local_ray",
    "tests/integration/test_actor_deaths.py": "local_ray",
    "tests/integration/test_resume.py::test_a_run_killed_at_a_random_moment": "reference",
    "tests/integration/test_resume.py::test_a_sigterm_saves": "reference",
    "tests/integration/test_resume.py::test_corrupted_checkpoint_is_refused": "reference",
    "tests/integration/test_resume.py::test_a_run_started_from_other_weights": "reference",
    "tests/integration/test_resume.py::test_an_evaluation_of_a_checkpoint": "reference",
    "tests/integration/test_resume.py::test_an_evaluation_of_the_starting_weights": "reference",
    "tests/integration/test_resume.py::test_a_run_saved_on_one_train_rank": "reference",
    "tests/integration/test_resume.py::test_a_hung_then_a_dead_train_rank": "reference",
    "tests/integration/test_resume.py::test_a_killed_engine_server_is_a_fault": "reference",
    "tests/integration/test_resume.py::test_a_short_chaos_run_survives": "reference",
}
# real-loop units run at once at most: a launch takes both cores of a 2-core machine while it
# starts, and more at once would only slow each other into their timeouts
REAL_LOOPS_AT_ONCE = 2


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (pyproject's addopts): the tests of the real loop (tests/integration,
    each a launch of Ray, engines and ranks) start first, one after another on one worker,
    while the other tests spread over the other workers beside them; once those are all
    handed out, a second worker takes real-loop tests too, so the end of the run is not one
    worker's queue of launches beside idle ones. Another --dist than pyproject's `load` gets
    xdist's own scheduler."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    def real_loop(scope: str) -> bool:
        return scope.startswith(REAL_LOOP)

    class RealLoopFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if not real_loop(nodeid):
                return nodeid
            shared = next((f for p, f in SHARED_LAUNCH.items() if nodeid.startswith(p)), None)
            module = nodeid.split("::")[0]
            # scopes are queued largest first: the shared launches', then one per test
            return f"{module}::{shared}" if shared else nodeid

        def _holds_real_loop(self, node: Any) -> bool:
            work = self.assigned_work[node].items()
            return any(real_loop(scope) and False in unit.values() for scope, unit in work)

        def _next_scope(self, node: Any) -> str | None:
            # each look reads the queue up to its first match, not the whole queue
            first = next(iter(self.workqueue), None)
            if node is self.nodes[0]:  # the real loop's worker; the others once none is left
                return next((scope for scope in self.workqueue if real_loop(scope)), first)
            other = next((scope for scope in self.workqueue if not real_loop(scope)), None)
            if other is not None:
                return other
            # only real-loop scopes are left (the first is the queue's first)
            running = sum(self._holds_real_loop(each) for each in self.nodes)
            if self._holds_real_loop(node) or running < REAL_LOOPS_AT_ONCE:
                return first
            return None  # idle until the queue empties and it is shut down

        def _assign_work_unit(self, node: Any) -> None:
            scope = self._next_scope(node)
            if scope is None:
                return
            self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

        def _reschedule(self, node: Any) -> None:
            if node.shutting_down:
                return
            if self.workqueue and self._pending_of(self.assigned_work[node]) <= 2:
                self._assign_work_unit(node)
            if not self.workqueue:  # every worker, idle ones included, finishes and ends
                for each in self.nodes:
                    if not each.shutting_down:
                        each.shutdown()

    return RealLoopFirst(config, log)


@pytest.fixture(autouse=True, scope="module")
def no_process_group_outlives_its_module() -> Any:
    """A torch.distributed group a module's tests left in this worker is destroyed when the
    module ends: ranks that a later test forks would inherit it (the megatron tests' ranks
    refuse to start then), whichever worker and order xdist gives the tests."""
    yield
    import sys

    dist = sys.modules.get("torch.distributed")  # only where a test imported torch
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def url(tiny_lm_dir: Path) -> Any:
    """A CPU engine server serving the tiny model on a thread of this worker, one for each
    test module that asks for it: its URL."""
    import torch

    from rlpost.backends.cpu_engine.engine import EngineSettings
    from rlpost.backends.cpu_engine.server import BackgroundServer

    threads = torch.get_num_threads()
    server = BackgroundServer(EngineSettings(model_path=str(tiny_lm_dir), num_threads=1))
    yield server.start()
    server.stop()
    torch.set_num_threads(threads)


SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TINY_LM_CONTEXT = 256


def train_tiny_tokenizer(vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on arithmetic sentences; <|im_end|> is EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = [f"What is {a}+{b}? The answer is {a + b}." for a in range(30) for b in range(30)]
    backend.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )


def save_tiny_lm(
    path: Path, *, hidden: int = 64, layers: int = 2, seed: int = 0, context: int = TINY_LM_CONTEXT
) -> Path:
    """Save a random Qwen3ForCausalLM and its tokenizer as a local HF folder."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = train_tiny_tokenizer()
    eos = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=context,
        tie_word_embeddings=True,
        eos_token_id=eos[0],
        pad_token_id=eos[1],
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = eos
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_lm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, hidden-64 random Qwen3 (about 0.1M parameters) with its tokenizer."""
    return save_tiny_lm(tmp_path_factory.mktemp("tiny_lm"))


TINY_ASSETS = Path(__file__).resolve().parents[1] / "rlpost" / "assets" / "qwen3-tiny"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def save_tiny_mistral(path: Path, *, hidden: int = 64, layers: int = 2, seed: int = 0) -> Path:
    """A random MistralForCausalLM (a family megatron-core has no spec for) with the shipped
    tiny model's tokenizer and chat template, so the default recipe's data reads with it."""
    import shutil

    import torch
    from transformers import MistralConfig, MistralForCausalLM

    shipped = json.loads((TINY_ASSETS / "config.json").read_text())
    config = MistralConfig(
        vocab_size=shipped["vocab_size"],
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=shipped["max_position_embeddings"],
        sliding_window=None,
        tie_word_embeddings=False,
        bos_token_id=shipped["bos_token_id"],
        eos_token_id=shipped["eos_token_id"],
        pad_token_id=shipped["pad_token_id"],
    )
    torch.manual_seed(seed)
    MistralForCausalLM(config).save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(TINY_ASSETS / name, path / name)
    return path


@pytest.fixture(scope="session")
def tiny_mistral_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, hidden-64 random Mistral with the shipped tiny tokenizer."""
    return save_tiny_mistral(tmp_path_factory.mktemp("tiny_mistral"))


def save_tiny_glm_moe(path: Path, *, hidden: int = 64, seed: int = 0) -> Path:
    """A random GLM-4.5-shaped mixture of experts with the shipped tiny tokenizer: a dense
    first layer, then an MoE layer of 4 experts (top-2) beside a shared expert, routed by a
    sigmoid router whose expert bias (a persistent buffer, in the checkpoint) is drawn at
    random as a pre-trained one would be."""
    import shutil

    import torch
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    shipped = json.loads((TINY_ASSETS / "config.json").read_text())
    config = Glm4MoeConfig(
        vocab_size=shipped["vocab_size"],
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        moe_intermediate_size=hidden // 2,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=shipped["max_position_embeddings"],
        tie_word_embeddings=False,
        bos_token_id=shipped["bos_token_id"],
        eos_token_id=shipped["eos_token_id"],
        pad_token_id=shipped["pad_token_id"],
    )
    torch.manual_seed(seed)
    model = Glm4MoeForCausalLM(config)
    model.model.layers[1].mlp.gate.e_score_correction_bias.normal_()
    model.save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(TINY_ASSETS / name, path / name)
    return path


@pytest.fixture(scope="session")
def tiny_glm_moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_glm_moe(tmp_path_factory.mktemp("tiny_glm_moe"))
