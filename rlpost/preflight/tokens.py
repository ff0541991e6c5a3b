"""The tokenizer and chat templates of model.hf_checkpoint against the model and the recipe:
token ids inside the embedding, the markers the graders look for reachable in a response, and
apply_chat_template_kwargs read by the template. Read from the folder's JSON and templates;
transformers is not imported.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from rlpost.config.chat_templates import (
    TOKENIZER_ARGUMENTS,
    added_token_ids,
    added_tokens,
    chat_templates,
    template_variables,
)
from rlpost.errors import Issue
from rlpost.schema import ModelConfig, RunConfig
from rlpost.schema.reward import GRADER_FLOOR, GRADER_MARKERS


def check_tokens_in_embedding(model: ModelConfig) -> list[Issue]:
    """A token id at or past model.vocab_size (config.json's, which the YAML is checked
    against) has no row in the embedding or the output layer: the first prompt or response
    holding it indexes past them. Tokens added to a tokenizer without resizing the model's
    embeddings are the usual source."""
    folder = Path(model.hf_checkpoint).expanduser()
    outside = {i: t for i, t in added_token_ids(folder).items() if i >= model.vocab_size}
    if not outside:
        return []
    shown = ", ".join(f"{t!r} = {i}" for i, t in sorted(outside.items())[:4])
    more = f" and {len(outside) - 4} more" if len(outside) > 4 else ""
    return [
        Issue(
            "model.hf_checkpoint",
            f"the tokenizer in {model.hf_checkpoint} has {len(outside)} token(s) with ids at "
            f"or past the model's vocabulary of model.vocab_size={model.vocab_size} "
            f"(config.json's vocab_size): {shown}{more}; the embedding and output layer have "
            "no row for them, so the first prompt or response holding one fails (an index "
            "error; on GPUs a device-side assert) after the engines and trainers have started",
            "resize the checkpoint's embeddings to the tokenizer and save it (transformers: "
            "model.resize_token_embeddings(len(tokenizer)), then model.save_pretrained), or "
            "use the tokenizer the checkpoint was trained with",
            value=model.hf_checkpoint,
        )
    ]


THINK_END = "</think>"


def check_thinking_reward(cfg: RunConfig) -> list[Issue]:
    """deepscaler grades only the text after `</think>` and pays 0 without one: a model
    whose tokenizer and chat templates never name `</think>` (no such token, no thinking
    block) never writes one, and every sample it is graded on would score 0."""
    keys = [f"recipe.{key}" for key, kind in cfg.recipe.rule_graders() if kind == "deepscaler"]
    if not keys:
        return []
    folder = Path(cfg.model.hf_checkpoint).expanduser()
    try:
        vocabulary = (folder / "tokenizer.json").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []  # a tokenizer of another format: cannot tell
    texts = [vocabulary, *chat_templates(folder).values()]
    if any(THINK_END in text for text in texts):
        return []
    return [
        Issue(
            key,
            f"deepscaler grades only the text after {THINK_END} and scores 0 without one, and "
            f"{cfg.model.hf_checkpoint} has no {THINK_END} (neither a token of its tokenizer "
            "nor in its chat templates): the model never opens a thinking block, so every "
            "sample it grades would score 0",
            "grade with math (the same answer check on the whole response), or use a "
            "thinking model",
            value="deepscaler",
        )
        for key in keys
    ]


def check_markers_survive_sampling(cfg: RunConfig) -> list[Issue]:
    """A grader's marker that is one of the tokenizer's added tokens (`</think>`) never
    reaches it when a stop token id ends generation at it, or when skip_special_tokens drops
    it from the text for being special (verl#1724, trl#2897: the reward then never pays).
    Stop strings are the schema's concern (RecipeConfig.check_stops_leave_the_answer)."""
    rollout = cfg.recipe.rollout
    graders = cfg.recipe.rule_graders()
    if not graders or not (rollout.stop_token_ids or rollout.skip_special_tokens):
        return []
    tokens = added_tokens(Path(cfg.model.hf_checkpoint).expanduser())
    for key, kind in graders:
        for marker in GRADER_MARKERS.get(kind, ()):
            for token_id in rollout.stop_token_ids:
                text = tokens.get(token_id, ("", False))[0]
                if text and (text in marker or marker in text):
                    return [
                        Issue(
                            "recipe.rollout.stop_token_ids",
                            f"recipe.{key}={kind} grades the answer a response writes after "
                            f"'{marker}', and stop_token_ids holds {token_id} ('{text}' in "
                            f"{cfg.model.hf_checkpoint}'s tokenizer): generation ends at it, "
                            f"before any answer, so every response it grades scores "
                            f"{GRADER_FLOOR[kind]:g} and no group has a signal",
                            f"remove {token_id} from recipe.rollout.stop_token_ids (the "
                            "end-of-turn token ends a response)",
                            value=rollout.stop_token_ids,
                        )
                    ]
            special = [i for i, (text, flag) in tokens.items() if flag and text == marker]
            if rollout.skip_special_tokens and special:
                return [
                    Issue(
                        "recipe.rollout.skip_special_tokens",
                        f"recipe.{key}={kind} looks for '{marker}' in each response, which "
                        f"{cfg.model.hf_checkpoint}'s tokenizer marks special (token "
                        f"{special[0]}), and skip_special_tokens: true leaves special tokens "
                        "out of the text the grader reads: every response it grades scores "
                        f"{GRADER_FLOOR[kind]:g} and no group has a signal",
                        "set recipe.rollout.skip_special_tokens: false (the default; the "
                        "graders read a response without its end-of-turn token anyway)",
                        value=True,
                    )
                ]
    return []


def check_template_kwargs(kwargs: dict[str, object], model: ModelConfig) -> list[Issue]:
    """Every apply_chat_template_kwargs key is read by the chat template it goes to: Jinja
    drops a variable a template never reads without a word (a misspelt enable_thinking
    leaves thinking on)."""
    passed = sorted(set(kwargs) - TOKENIZER_ARGUMENTS)
    if not passed:
        return []
    folder = Path(model.hf_checkpoint).expanduser()
    templates = chat_templates(folder)
    chosen = kwargs.get("chat_template")
    source: str | None
    if isinstance(chosen, str):
        source = templates.get(chosen, chosen)  # a named template, or the template itself
        which = (
            f"the chat template {chosen!r}" if chosen in templates else "the chat template given"
        )
    else:
        source = templates.get("default")
        which = f"the chat template of {model.hf_checkpoint}"
    reads = template_variables(source) if source else None
    if reads is None:
        return []
    issues = []
    for key in passed:
        if key in reads:
            continue
        near = difflib.get_close_matches(key, sorted(reads), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        issues.append(
            Issue(
                f"recipe.data.apply_chat_template_kwargs.{key}",
                f"{which} never reads {key!r}{hint}, so the tokenizer drops it without a word "
                f"(it reads {', '.join(sorted(reads))})",
                "spell it as the template does, or remove it",
                value=kwargs[key],
            )
        )
    return issues
