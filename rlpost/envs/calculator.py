"""A calculator tool and the multi-turn generate function that uses it.

The model answers a question it cannot work out in its head by writing one call,
`<calc>23*47</calc>`, and ending its turn. The environment evaluates the call and answers in a
tool turn (rendered with the chat template's tool role, never trained); the model then states
the result, `\\boxed{1081}`. A turn with no call ends the episode.

    recipe.rollout.generate_function: rlpost.envs.calculator.generate
    recipe.rollout.max_turns: 2          # the call, then the answer

Nothing here imports torch or the engines: the tool is plain Python, the generation goes
through the context (rlpost.runtime.rollout.context.GenerateContext).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from rlpost.types import Sample, SampleStatus

if TYPE_CHECKING:
    from rlpost.runtime.rollout.context import GenerateContext

CALL_OPEN, CALL_CLOSE = "<calc>", "</calc>"
CALL_PATTERN = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)
EXPRESSION = re.compile(r"\s*(-?\d{1,12})\s*([-+*])\s*(-?\d{1,12})\s*")
OPERATIONS = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__}

# A tool: (the call's expression, the context) -> the text the environment turn carries.
ToolFn = Callable[[str, "GenerateContext"], Awaitable[str]]


def format_call(expression: str) -> str:
    """The text of a call, as the model is taught to write it."""
    return f"{CALL_OPEN}{expression}{CALL_CLOSE}"


def find_call(text: str, open_tag: str = CALL_OPEN, close_tag: str = CALL_CLOSE) -> str | None:
    """The text of the last call in `text`, or None when the turn makes no call."""
    pattern = CALL_PATTERN
    if (open_tag, close_tag) != (CALL_OPEN, CALL_CLOSE):
        pattern = re.compile(re.escape(open_tag) + r"(.*?)" + re.escape(close_tag), re.DOTALL)
    calls = pattern.findall(text)
    return calls[-1] if calls else None


def calculate(expression: str) -> str:
    """What the calculator answers: the value of `a op b` (op one of + - *), or an error the
    model can read. Only integer arithmetic on two operands: nothing is ever evaluated as code.
    """
    match = EXPRESSION.fullmatch(expression)
    if match is None:
        return "error: write one operation on two integers, e.g. 12*34"
    left, op, right = match.groups()
    return str(OPERATIONS[op](int(left), int(right)))


async def run_tool_loop(
    sample: Sample,
    ctx: GenerateContext,
    tool: ToolFn,
    open_tag: str = CALL_OPEN,
    close_tag: str = CALL_CLOSE,
) -> Sample:
    """Policy turns until one makes no call, `ctx.max_turns` policy turns are done, or the
    response budget runs out; after each turn with a call (`open_tag`...`close_tag`), the
    tool's answer as an environment turn. Continues where an interrupted turn left off (a
    weight update), so it can be called again on the sample it returned."""
    while not sample.finished:
        turn = await ctx.policy_turn(sample)
        if turn.status is not SampleStatus.COMPLETED:
            return sample  # truncated; or aborted: called again to continue the turn
        call = find_call(turn.text, open_tag, close_tag)
        if call is None or sample.turns >= ctx.max_turns:
            return sample  # the answer (or the last allowed turn): completed
        ctx.environment_turn(sample, await tool(call, ctx))
    return sample


async def local_calculator(call: str, ctx: GenerateContext) -> str:
    return calculate(call)


async def generate(sample: Sample, ctx: GenerateContext) -> Sample:
    """The generate function of recipe grpo_tiny_calculator (see the module docstring)."""
    return await run_tool_loop(sample, ctx, local_calculator)


def check_settings(settings: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The calculator reads no settings: each one given would be ignored, so each is refused
    (config validation calls this before anything starts)."""
    return [
        (
            name,
            f"{name}={value!r} has no effect: rlpost.envs.calculator.generate reads no "
            "settings (its tool is the local calculator, its tags <calc></calc>)",
            "remove it from generate_settings; a tool behind HTTP with its own url, tags "
            "and timeouts is rlpost.envs.http_tool.generate",
        )
        for name, value in settings.items()
    ]


generate.min_turns = 2  # type: ignore[attr-defined]  # the call, then the answer
generate.check_settings = check_settings  # type: ignore[attr-defined]
