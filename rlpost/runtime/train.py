"""A training launch, top to bottom: record it, load its inputs, start the Session, run the
train steps (rlpost.runtime.loop), and end it.

A failure after the start ends the launch with one message (what failed, the run directory,
the newest checkpoint to resume from) and exit status 3. A fault (a train rank, an engine,
the router or an actor of the driver died, a collective hung) restarts the launch from the
newest complete checkpoint, up to `run.max_restarts` times, each restart recorded in
launches.jsonl. SIGTERM stops it as `run.on_sigterm` says (rlpost.runtime.stop), with exit
status 143 and no restart. However a launch (or restart) that wrote its start line ends, it
says how in launch_ends.jsonl (rlpost.runtime.launches).
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rlpost.data.source import DataSource
from rlpost.errors import Issue, Location, UserError
from rlpost.plan import Plan
from rlpost.plan.runtime import resolve_engine_backend
from rlpost.rewards.model import build_reward_model
from rlpost.runtime import checkpoint
from rlpost.runtime.determinism import seed_driver
from rlpost.runtime.evaluation import (
    EvalReport,
    EvalSet,
    eval_response_len,
    format_eval_table,
    load_eval_sets,
)
from rlpost.runtime.failures import (
    describe,
    failed,
    interrupted,
    is_fault,
    record_failure,
    stopped,
)
from rlpost.runtime.launches import LaunchEnd, ending, launch_count, record_end
from rlpost.runtime.loop import Inputs, TrainLoop
from rlpost.runtime.progress import status
from rlpost.runtime.resume import ResumePoint, find_resume_point, set_aside_newer
from rlpost.runtime.rollout.manager import SamplingSettings
from rlpost.runtime.run_state import left_by, read_groups
from rlpost.runtime.rundir import prepare_run_dir, run_dir_of
from rlpost.runtime.session import Session
from rlpost.runtime.stop import Stopped, StopSignal
from rlpost.schema import RunConfig


def run(cfg: RunConfig, plan: Plan, resume: ResumePoint | None = None) -> Path:
    """Train as configured, from `resume` (see find_resume_point) or rollout 0; returns the
    run directory. Raises RunFailed when the run cannot finish."""
    # Nothing is fetched from a model hub at run time: every path is local.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    run_dir = run_dir_of(cfg)
    total = cfg.recipe.rollout.num_rollout
    restarts = 0
    while True:
        start = resume.start_rollout if resume else 0
        if start >= total and cfg.mode == "train":
            if resume is None or resume.state.unfinished is None:
                status(
                    f"{start} rollouts are done and recipe.rollout.num_rollout={total}: "
                    "nothing to train; raise num_rollout to continue the run"
                )
                return run_dir
            # a SIGTERM's save (or a failed evaluation's): the last rollout's record,
            # evaluation and HF export wait
            status(finishing(start, total, resume.state.unfinished))
        prepare_run_dir(cfg, start, restart=restarts)
        launch = launch_count(run_dir) - 1
        try:
            reports = _launch(cfg, plan, run_dir, resume, restarts)
        except Restart as restart:
            record_end(run_dir, launch, LaunchEnd("restarted", None, restart.fault))
            fault = restart.fault
        except BaseException as exc:
            end = ending(exc)
            if end is not None:
                record_end(run_dir, launch, end)
            raise
        else:
            record_end(run_dir, launch, LaunchEnd("finished", 0))
            break
        restarts += 1
        resume = find_resume_point(_resuming(cfg, run_dir), plan, run_dir)
        where = resume.path if resume else "rollout 0 (no checkpoint yet)"
        status(
            f"{fault}\n[rlpost] restarting from {where} "
            f"(restart {restarts} of run.max_restarts={cfg.run.max_restarts})"
        )
    if reports:
        print(format_eval_table(reports))
    print(f"run directory: {run_dir}")
    return run_dir


def finishing(done: int, total: int, unfinished: dict[str, Any]) -> str:
    """What a resumed run that has no rollout to train does: what the checkpoint's
    `unfinished` says was left of its last rollout."""
    return (
        f"{done} rollouts are done and recipe.rollout.num_rollout={total}: no rollout to "
        f"train; finishing what {left_by(unfinished)} left of rollout {done - 1}"
    )


class Restart(Exception):
    """A fault that a restart in place mends (run.max_restarts): `fault`, in a line or two."""

    def __init__(self, fault: str) -> None:
        super().__init__(fault)
        self.fault = fault


def _launch(
    cfg: RunConfig, plan: Plan, run_dir: Path, resume: ResumePoint | None, restarts: int
) -> list[EvalReport]:
    """One launch (or restart) after its start line: its reports when it finishes; RunFailed
    (stopped, interrupted, failed), a UserError, or Restart when it ends otherwise."""
    evaluation = cfg.mode == "eval"  # saves no checkpoint: a failure names none to resume
    if resume:
        set_aside_newer(run_dir, resume.start_rollout)
    if cfg.run.deterministic:
        seed_driver(cfg.run.seed)
    # The inputs (tokenizer, data) load while Ray starts; the session waits for them
    # before it starts any actor, so a data problem still stops the run before then.
    stop = StopSignal(cfg.run.on_sigterm)
    resumed = resume.path if resume else None  # where this attempt continues from
    with ThreadPoolExecutor(1, thread_name_prefix="rlpost-inputs") as loading:
        inputs = loading.submit(load_inputs, cfg, resume)
        try:
            return asyncio.run(_train(cfg, plan, run_dir, inputs, resume, stop))
        except UserError:
            raise
        except KeyboardInterrupt:
            raise interrupted(run_dir, restarts, evaluation, resumed) from None
        except Stopped as halted:
            raise stopped(halted, run_dir, restarts, "", evaluation, resumed) from None
        except asyncio.CancelledError:
            if not stop.signalled:
                raise
            raise stopped(None, run_dir, restarts, "", evaluation, resumed) from None
        except Exception as exc:
            record_failure(run_dir, exc)
            if stop.signalled:  # a save on SIGTERM that failed: the run stops all the same
                what = describe(exc)
                raise stopped(None, run_dir, restarts, what, evaluation, resumed) from exc
            if not is_fault(exc) or restarts >= cfg.run.max_restarts:
                raise failed(describe(exc), run_dir, restarts, evaluation, resumed) from exc
            raise Restart(describe(exc)) from exc


async def _train(
    cfg: RunConfig,
    plan: Plan,
    run_dir: Path,
    inputs: Future[Inputs],
    resume: ResumePoint | None,
    stop: StopSignal,
) -> list[EvalReport]:
    loaded: asyncio.Future[Inputs] = asyncio.wrap_future(inputs)
    stop.install()
    try:
        # installed again once Ray has started: its driver puts a handler of its own in place
        session = Session(
            cfg,
            plan,
            run_dir,
            before_actors=loaded,
            after_ray=stop.install,
            resume_from=resume.path if resume else None,
        )
        async with session:
            loop = TrainLoop(cfg, plan, session, inputs.result(), resume, stop)
            try:
                return await loop.run()
            except Stopped:
                raise
            except Exception as exc:
                fault = await session.fault_behind(exc)
                if fault is not None:
                    raise fault from exc
                raise
    finally:
        stop.uninstall()


def _resuming(cfg: RunConfig, run_dir: Path) -> RunConfig:
    """The same run, continuing from its newest checkpoint (a restart); before it has saved
    one, from where the launch started: the checkpoint it was given (a fork of another run's:
    run.resume=auto would find none in run_dir and start at rollout 0), or rollout 0. An
    evaluation, which saves none, evaluates the weights it was given again."""
    found = checkpoint.scan(run_dir, check_hashes=False)
    if cfg.mode == "eval" or not (found.complete or found.broken):
        return cfg
    return cfg.model_copy(update={"run": cfg.run.model_copy(update={"resume": "auto"})})


def load_inputs(cfg: RunConfig, resume: ResumePoint | None) -> Inputs:
    from transformers import AutoTokenizer

    recipe, rollout = cfg.recipe, cfg.recipe.rollout
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.hf_checkpoint, local_files_only=True)
    data = None  # mode=eval draws no training prompt: none is read (they may not be here)
    if cfg.mode != "eval":
        data = DataSource.from_config(
            recipe.data,
            tokenizer,
            n_samples_per_prompt=rollout.n_samples_per_prompt,
            buffer_filter=rollout.buffer_filter,
            prompts_per_rollout=rollout.batch_size,
        )
        if resume:
            data.load_state(resume.state.data)
            data.add_to_buffer(read_groups(resume.path).buffer)
    sampling = SamplingSettings(
        max_new_tokens=rollout.max_response_len,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        stop=tuple(rollout.stop),
        stop_token_ids=tuple(rollout.stop_token_ids),
        skip_special_tokens=rollout.skip_special_tokens,
    )
    eval_sets = load_eval_sets(recipe, tokenizer, rollout.stop_token_ids)
    too_long = context_issues(cfg, data, eval_sets) + turn_end_issues(cfg, tokenizer)
    if too_long:
        raise UserError(too_long, title="data error")
    return Inputs(data, eval_sets, sampling, tokenizer, _driver_reward_model(cfg))


def _driver_reward_model(cfg: RunConfig) -> Any:
    """The reward model class built in this process (reward.model_placement: driver), with
    the inputs: one that cannot be built stops the run before any actor starts."""
    reward = cfg.recipe.rollout.reward
    if reward.type != "model" or reward.model is None or reward.model_placement != "driver":
        return None
    return build_reward_model(reward.model, reward.model_settings, "cpu")


TURN_PROBE = "rlpost-turn-probe"


def turn_end_issues(cfg: RunConfig, tokenizer: Any) -> list[Issue]:
    """The token the chat template closes an assistant turn with must stop the engines:
    they stop at the checkpoint's eos ids (config.json, generation_config.json, the
    tokenizer's) and recipe.rollout.stop_token_ids, and a base model's eos is often its
    end-of-text, not the template's end-of-turn (Qwen's <|endoftext|> against <|im_end|>).
    Then every response runs on to max_response_len, writing turns of its own. Judged by
    rendering one assistant turn with the template; nothing when the turn's end is not one
    special token."""
    data, rollout = cfg.recipe.data, cfg.recipe.rollout
    if not data.apply_chat_template:
        return []
    turn = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": TURN_PROBE}]
    try:
        text = tokenizer.apply_chat_template(
            turn, tokenize=False, **dict(data.apply_chat_template_kwargs)
        )
    except Exception:  # a template that refuses the probe: nothing to learn
        return []
    if not isinstance(text, str) or TURN_PROBE not in text:
        return []
    after = text.rsplit(TURN_PROBE, 1)[1]
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
    if not ids or ids[0] not in _special_ids(tokenizer):
        return []
    end = int(ids[0])
    eos = _eos_ids(cfg.model.hf_checkpoint, tokenizer)
    given = list(rollout.stop_token_ids)
    end_text = tokenizer.convert_ids_to_tokens(end)
    if end in eos or end in given or end_text in rollout.stop:
        return []
    return [
        Issue(
            "recipe.rollout.stop_token_ids",
            f"the chat template ends an assistant turn with {end_text!r} (id {end}), and the "
            f"engines stop only at the checkpoint's eos ids {sorted(eos)} and stop_token_ids "
            f"{given}: every response would run on to max_response_len, writing turns of "
            "its own",
            f"add it: recipe.rollout.stop_token_ids: {[*given, end]} (or set eos_token_id to "
            f"{end} in the checkpoint's generation_config.json)",
            value=given,
        )
    ]


def _special_ids(tokenizer: Any) -> set[int]:
    """The tokenizer's special tokens: its named ones and every added token marked special
    (a chat template's markers are often only the latter)."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    marked = {int(i) for i, token in added.items() if getattr(token, "special", False)}
    return marked | set(getattr(tokenizer, "all_special_ids", ()))


def _eos_ids(folder: str, tokenizer: Any) -> set[int]:
    """The ids the engines stop at for the checkpoint: the tokenizer's eos, and config.json's
    and generation_config.json's eos_token_id (a number or a list)."""
    import json

    found: set[int] = set()
    values: list[Any] = [getattr(tokenizer, "eos_token_id", None)]
    for name in ("config.json", "generation_config.json"):
        try:
            values.append(json.loads((Path(folder) / name).read_text()).get("eos_token_id"))
        except (OSError, ValueError, AttributeError):
            continue
    for value in values:
        items = value if isinstance(value, list) else [value]
        found.update(int(v) for v in items if isinstance(v, int) and not isinstance(v, bool))
    return found


def context_issues(
    cfg: RunConfig, data: DataSource | None, eval_sets: list[EvalSet]
) -> list[Issue]:
    """A prompt, tokenized, whose request (prompt + response) is longer than the engines'
    context: the config alone bounds it only by max_prompt_len (data's for training, eval's
    for the evaluation sets), which may be unset, and the engines would refuse it at the
    first rollout or evaluation that draws it. One issue for training, one per set."""
    rollout, context = cfg.recipe.rollout, cfg.model.max_position_embeddings
    where = "model.max_position_embeddings"
    if resolve_engine_backend(cfg) == "sglang":
        limit = cfg.layout.rollout.sglang.get("context_length")
        if isinstance(limit, int) and not isinstance(limit, bool) and limit < context:
            context, where = limit, "layout.rollout.sglang.context_length"
    issues = []
    # training's samples stay within a generic model's window (the trainers attend over the
    # whole sample); the schema bounds them only as far as data.max_prompt_len is set
    trained, trained_where, why = context, where, "the engines would refuse those requests mid-run"
    window = cfg.model.sliding_window
    if window is not None and window < trained:
        trained, trained_where = window, "model.sliding_window"
        why = (
            "the trainers would attend over the whole sample, where the checkpoint's "
            "attention sees only its window"
        )
    # the jsonl source's (a class's: unknown; mode=eval's: none)
    prompts = getattr(data.source, "prompts", None) if data is not None else None
    if prompts:
        prompt = max(len(p.prompt_ids) for p in prompts)
        response = rollout.max_response_len
        if prompt + response > trained:
            issues.append(
                Issue(
                    "recipe.rollout.max_response_len",
                    f"the longest prompt is {prompt} tokens, and {prompt} + {response} "
                    f"response tokens = {prompt + response} is beyond {trained_where}="
                    f"{trained}: {why}",
                    f"at most {trained - prompt} response tokens, or recipe.data."
                    f"max_prompt_len: {trained - response} to leave out the longest prompts",
                    value=response,
                )
            )
    for i, evaluation in enumerate(eval_sets):
        prompt = max((len(g[0].prompt_ids) for g in evaluation.groups if g), default=0)
        key, response = eval_response_len(cfg.recipe, i)
        if prompt + response > context:
            issues.append(
                Issue(
                    key,
                    f"evaluation set {evaluation.name!r}'s longest prompt is {prompt} tokens, "
                    f"and {prompt} + {response} response tokens = {prompt + response} is "
                    f"beyond {where}={context}: the engines would refuse those requests at "
                    "its first evaluation",
                    f"at most {context - prompt} response tokens, or recipe.eval."
                    f"max_prompt_len: {context - response} to leave out the longest prompts",
                    value=response,
                    location=Location(file=evaluation.path) if evaluation.path else None,
                )
            )
    return issues
