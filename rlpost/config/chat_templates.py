"""A checkpoint's chat templates read from its files, without transformers: the templates
by name, the variables one reads, and the special tokens it writes around a message (what
`rlpost validate` checks prompts and template arguments against; the run's prompt loader
finds the same with the tokenizer, rlpost.data.prompts)."""

from __future__ import annotations

import json
from pathlib import Path

# apply_chat_template's own keyword arguments: transformers reads them, the template never
TOKENIZER_ARGUMENTS = frozenset(
    {"chat_template", "documents", "padding", "truncation", "max_length", "return_tensors",
     "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"}
)  # fmt: skip


def chat_templates(folder: Path) -> dict[str, str]:
    """The checkpoint's chat templates by name ("default": the one used unless another is
    named): chat_template.jinja, chat_template.json, additional_chat_templates/*.jinja, and
    tokenizer_config.json's chat_template (a string, or a list of {name, template})."""
    found: dict[str, str] = {}
    config = json_object(folder / "tokenizer_config.json")
    inline = config.get("chat_template")
    if isinstance(inline, str):
        found["default"] = inline
    elif isinstance(inline, list):
        found |= {
            str(t["name"]): str(t["template"])
            for t in inline
            if isinstance(t, dict) and "name" in t and "template" in t
        }
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        found |= {p.stem: p.read_text(encoding="utf-8") for p in sorted(extra.glob("*.jinja"))}
    in_json = json_object(folder / "chat_template.json").get("chat_template")
    if isinstance(in_json, str):
        found["default"] = in_json
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        found["default"] = jinja.read_text(encoding="utf-8")
    return found


def json_object(path: Path) -> dict[str, object]:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def template_variables(source: str) -> frozenset[str] | None:
    """The variables a Jinja chat template reads from its caller; None when it does not
    parse here (a tag of transformers' own, say)."""
    import jinja2
    import jinja2.meta

    env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    try:
        return frozenset(jinja2.meta.find_undeclared_variables(env.parse(source)))
    except jinja2.TemplateSyntaxError:
        return None


def template_markers(folder: Path) -> tuple[str, ...]:
    """The special tokens the checkpoint's default chat template writes around one user
    message with the generation prompt, as the prompt loader finds them by rendering it
    (rlpost.data.prompts): read from tokenizer.json's added tokens and tokenizer_config.json,
    the template rendered by Jinja here. Empty when the template does not render here."""
    import jinja2
    import jinja2.sandbox

    source = chat_templates(folder).get("default")
    if not source:
        return ()
    config = json_object(folder / "tokenizer_config.json")
    named = {k: _token_text(config.get(k)) for k in ("bos_token", "eos_token", "pad_token")}
    special = [*_added_special_tokens(folder), *(t for t in named.values() if t)]
    for key in ("extra_special_tokens", "additional_special_tokens"):
        listed = config.get(key)
        special += [t for t in map(_token_text, listed) if t] if isinstance(listed, list) else []
    decoder = config.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        special += [
            str(t["content"]) for t in decoder.values() if isinstance(t, dict) and t.get("special")
        ]

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    try:
        probe = env.from_string(source).render(
            messages=[{"role": "user", "content": "x"}],
            add_generation_prompt=True,
            **{k: v or "" for k, v in named.items()},
        )
    except Exception:  # a tag or function of transformers' own: the run's loader judges
        return ()
    return tuple(t for t in dict.fromkeys(special) if t and t in probe)


def _token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or {content: ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def added_tokens(folder: Path) -> dict[int, tuple[str, bool]]:
    """tokenizer.json's added tokens, id -> (text, marked special), read without parsing
    the vocabulary (the list comes before it); empty where there is no such file."""
    try:
        text = (folder / "tokenizer.json").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    at = text.find('"added_tokens"')
    start = text.find("[", at) if at >= 0 else -1
    if start < 0:
        return {}
    try:
        added, _ = json.JSONDecoder().raw_decode(text, start)
    except ValueError:
        return {}
    if not isinstance(added, list):
        return {}
    return {
        t["id"]: (t["content"], bool(t.get("special")))
        for t in added
        if isinstance(t, dict)
        and isinstance(t.get("id"), int)
        and isinstance(t.get("content"), str)
    }


def added_token_ids(folder: Path) -> dict[int, str]:
    """Every added token's id -> text: tokenizer.json's added tokens and tokenizer_config.json's
    added_tokens_decoder (ids written as strings), which the tokenizer loads alike."""
    found = {i: text for i, (text, _) in added_tokens(folder).items()}
    decoder = json_object(folder / "tokenizer_config.json").get("added_tokens_decoder")
    if isinstance(decoder, dict):
        for key, token in decoder.items():
            text = _token_text(token)
            if isinstance(key, str) and key.isdigit() and text is not None:
                found.setdefault(int(key), text)
    return found


def _added_special_tokens(folder: Path) -> list[str]:
    """tokenizer.json's added tokens marked special."""
    return [text for text, special in added_tokens(folder).values() if special]
