"""Rule-based graders: pure functions from (response, label) to a reward.

They run in grading worker processes (see `pool.py`) but are plain functions, safe to call
from any thread: math_verify is always called with its signal-based timeouts disabled, since
signal.alarm only works in a main thread. Time limits are the caller's job.
"""

from __future__ import annotations

import logging
import re
import string
from collections import Counter
from collections.abc import Callable
from functools import cache, lru_cache
from types import ModuleType

BOX_COMMANDS = ("\\boxed", "\\fbox")
THINK_END = "</think>"
DAPO_CORRECT = 1.0
DAPO_INCORRECT = -1.0

_ANSWER_LINE = re.compile(r"answer\s*:", re.IGNORECASE)
_INTEGER = re.compile(r"[+-]?[0-9]+")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`, `\\boxed 5`) in `text`.

    Braces nest, and escaped braces (`\\{`) do not count. None when there is no box or the
    last one never closes (a response cut off inside its answer).
    """
    start, command = max((text.rfind(cmd), cmd) for cmd in BOX_COMMANDS)
    if start < 0:
        return None
    pos = start + len(command)
    if pos < len(text) and text[pos] == " ":  # `\boxed 5`: one space-delimited token
        token = text[pos + 1 :].split(maxsplit=1)
        return token[0].rstrip("$.") if token else None
    if pos >= len(text) or text[pos] != "{":
        return None
    depth = 0
    i = pos
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[pos + 1 : i]
        i += 1
    return None


def grade_math(response: str, label: str) -> float:
    """1.0 when the last boxed answer in `response` equals `label` mathematically, else 0.0."""
    answer = last_boxed(response)
    if answer is None:
        return 0.0
    return 1.0 if answers_match(answer, label) else 0.0


def grade_deepscaler(response: str, label: str) -> float:
    """Only the text after the last `</think>` counts; without one the reward is 0."""
    if THINK_END not in response:
        return 0.0
    return grade_math(response.rsplit(THINK_END, 1)[1], label)


def grade_dapo(response: str, label: str) -> float:
    """DAPO's format: the answer follows the last `Answer:`; +1 if correct, -1 otherwise.

    DAPO scores wrong or missing answers -1, not 0. With group-normalised advantages
    (GRPO) the two scales give the same advantages; only logged reward means differ.
    """
    matches = list(_ANSWER_LINE.finditer(response))
    if not matches:
        return DAPO_INCORRECT
    line = response[matches[-1].end() :].split("\n", 1)[0]
    answer = line.strip().strip("$").rstrip(".").strip()
    boxed = last_boxed(answer)
    if boxed is not None:
        answer = boxed
    if not answer:
        return DAPO_INCORRECT
    return DAPO_CORRECT if answers_match(answer, label) else DAPO_INCORRECT


def f1_score(response: str, label: str) -> float:
    """Token-level F1 between response and label after SQuAD-style normalisation."""
    predicted = _normalize_words(response).split()
    gold = _normalize_words(label).split()
    if not predicted or not gold:
        return float(predicted == gold)
    common = sum((Counter(predicted) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision = common / len(predicted)
    recall = common / len(gold)
    return 2 * precision * recall / (precision + recall)


def answers_match(answer: str, label: str) -> bool:
    """Whether an extracted answer equals the label: symbolically, then as normalised text.
    Two plain integers (DAPO-Math's labels, the arithmetic default's) are compared as
    integers, which is math_verify's verdict on them at a hundredth of its cost."""
    text, gold_text = answer.strip().strip("$").strip(), _gold_text(label)
    if _INTEGER.fullmatch(text) and _INTEGER.fullmatch(gold_text):
        return int(text) == int(gold_text)
    gold = _parse_gold(label)
    predicted = _parse_latex(answer.strip().strip("$"))
    if gold and predicted:
        mv = _math_verify()
        if mv.verify(gold, predicted, timeout_seconds=None):
            return True
    return _normalize_text(answer) == _normalize_text(_gold_text(label))


CHOICE_LETTERS = string.ascii_uppercase[:10]
"""The letters a multiple-choice answer may name when the data does not list its options
(GPQA has four, MMLU-Pro ten)."""

_STATED_CHOICE = re.compile(
    r"(?i:\b(?:answer|option|choice)\b)\s*(?i:is\b)?\s*[:=]?\s*(?:\*\*)?[\(\[]?"
    r"([A-Z])[\)\]]?(?:\*\*)?(?![A-Za-z0-9])"
)
_BOXED_CHOICE = re.compile(r"\s*[\(\[]?([A-Z])[\)\]]?(?:[\s.:)].*)?", re.DOTALL)
_BRACKETED_CHOICE = re.compile(r"\(([A-Z])\)")


def chosen_letter(response: str, letters: str = CHOICE_LETTERS) -> str | None:
    """The option a response settles on, among `letters`: its last boxed answer when that is
    a letter, else the last "answer is (C)" / "Answer: C" / "the correct option is C", else
    its last "(C)". Only the text after the last `</think>` counts. A capital letter standing
    alone elsewhere ("I think") is no answer."""
    text = response.rsplit(THINK_END, 1)[-1]
    boxed = last_boxed(text)
    if boxed is not None and (letter := _answer_letter(boxed, letters)):
        return letter
    for pattern in (_STATED_CHOICE, _BRACKETED_CHOICE):
        found = [m.group(1) for m in pattern.finditer(text) if _names_option(m, letters)]
        if found:
            return found[-1]
    return None


def _answer_letter(answer: str, letters: str) -> str | None:
    """The option an answer (a box's content) is: 'C', '(C)', 'C. Paris'; else None."""
    match = _BOXED_CHOICE.fullmatch(_TEXT_WRAPPER.sub(r"\1", answer))
    return match.group(1) if match and match.group(1) in letters else None


def _names_option(match: re.Match[str], letters: str) -> bool:
    """The letter is an option, and not the pronoun ("Answer: I think it is B")."""
    letter = match.group(1)
    pronoun = letter == "I" and re.match(r"\s+[a-z']", match.string[match.end() :])
    return letter in letters and not pronoun


def choice_label(label: object, metadata: dict[str, object] | None = None) -> str:
    """A multiple-choice label as the grader takes it, 'C/ABCD/paris' (the right letter, the
    options' letters, then the right option's words when known, '|'-separated): from
    metadata['correct_letter'], or a label that is the letter, its 0-based index, or the
    option's text among metadata['choices'] (a list, or a dict of letter -> text). The
    letters are metadata['valid_letters'] when given, else one per choice, else A-J; the
    option's words are its choice's text, and metadata['correct_answer'] or ['answer_text'].
    ValueError when the label names no option."""
    metadata = metadata or {}
    options = metadata.get("choices")
    texts = list(options.values()) if isinstance(options, dict) else options
    texts = texts if isinstance(texts, list) else []
    letters = _valid_letters(metadata.get("valid_letters")) or (
        CHOICE_LETTERS[: len(texts)] if texts else CHOICE_LETTERS
    )
    stated = metadata.get("correct_letter")
    text = str(stated if isinstance(stated, str) else label).strip()
    correct = None
    if text.upper() in letters and len(text) == 1:
        correct = text.upper()
    elif text.isdigit() and int(text) < len(letters):
        correct = letters[int(text)]
    else:
        wanted = _normalize_words(text)
        for letter, option in zip(letters, texts, strict=False):
            if wanted and _normalize_words(str(option)) == wanted:
                correct = letter
                break
    if correct is None:
        where = "its letter (A-" + letters[-1] + "), its 0-based index"
        raise ValueError(
            f"label {text[:40]!r} names no option: give {where}, or the option's text with the "
            "options in metadata['choices']"
        )
    index = letters.index(correct)
    words = [str(texts[index])] if index < len(texts) else []
    words += [str(metadata[k]) for k in ("correct_answer", "answer_text") if metadata.get(k)]
    targets = dict.fromkeys(w for w in map(_normalize_words, words) if w)
    return f"{correct}/{letters}" + (f"/{'|'.join(targets)}" if targets else "")


def _valid_letters(value: object) -> str:
    """metadata['valid_letters'] (a list of letters, or a string of them) as 'ABC', or ''."""
    items = list(value) if isinstance(value, list | tuple | str) else []
    letters = "".join(dict.fromkeys(str(i).strip().upper() for i in items))
    return letters if letters and all(c in string.ascii_uppercase for c in letters) else ""


def grade_choice(response: str, label: str) -> float:
    """1.0 when the response settles on the labelled option ('C/ABCD/paris', see
    choice_label), else 0.0. A response that names no option letter at all counts when it
    states the right option's words (whole words, after the last `</think>`), as slime's
    GPQA grader does."""
    correct, _, rest = label.partition("/")
    letters, _, targets = rest.partition("/")
    chosen = chosen_letter(response, letters or CHOICE_LETTERS)
    if chosen is not None:
        return 1.0 if chosen == correct else 0.0
    said = f" {_normalize_words(response.rsplit(THINK_END, 1)[-1])} "
    return 1.0 if any(f" {t} " in said for t in targets.split("|") if t) else 0.0


def grade_boxed_choice(answer: str, label: str) -> float:
    """grade_choice of a boxed answer alone (the box's content): the option it is ('C',
    '(C)', 'C. Paris'), else the option it states or whose words it gives."""
    correct, _, rest = label.partition("/")
    letter = _answer_letter(answer, rest.partition("/")[0] or CHOICE_LETTERS)
    if letter is not None:
        return 1.0 if letter == correct else 0.0
    return grade_choice(answer, label)


GRADERS: dict[str, Callable[[str, str], float]] = {
    "math": grade_math,
    "deepscaler": grade_deepscaler,
    "dapo": grade_dapo,
    "f1": f1_score,
    "gpqa": grade_choice,
    "boxed_gpqa": grade_boxed_choice,  # on the last box's content (the hub extracts it)
}


def warm_up() -> None:
    """Import math_verify and sympy now (grading workers call this when they start)."""
    answers_match("\\frac{1}{2}", "0.5")


@cache
def _math_verify() -> ModuleType:
    import math_verify  # type: ignore[import-untyped]

    # We disable math_verify's timeouts on purpose (they need the main thread); its
    # warning about that would print once per worker process.
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).setLevel(logging.ERROR)
    module: ModuleType = math_verify
    return module


def _parse_latex(expression: str) -> list[object]:
    if not expression:
        return []
    mv = _math_verify()
    config = [mv.LatexExtractionConfig(), mv.ExprExtractionConfig()]
    return list(mv.parse(f"${expression}$", extraction_config=config, parsing_timeout=None))


@lru_cache(maxsize=4096)
def _parse_gold_cached(label: str) -> tuple[object, ...]:
    return tuple(_parse_latex(_gold_text(label)))


def _parse_gold(label: str) -> list[object]:
    return list(_parse_gold_cached(label))


def _gold_text(label: str) -> str:
    label = str(label).strip()
    boxed = last_boxed(label)
    return (boxed if boxed is not None else label).strip().strip("$")


def _normalize_text(text: str) -> str:
    text = _TEXT_WRAPPER.sub(r"\1", text)
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "$", " "):
        text = text.replace(token, "")
    return text.rstrip(".").lower()


def _normalize_words(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return " ".join(word for word in text.split() if word not in ("a", "an", "the"))
