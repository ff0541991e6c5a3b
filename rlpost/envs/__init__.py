"""Environments and tools for multi-turn rollouts, usable as generate functions by dotted path.

- `rlpost.envs.calculator.generate`: the model writes `<calc>a*b</calc>`, a calculator in this
  process answers in a tool turn, the model states the result (recipe grpo_tiny_calculator).
- `rlpost.envs.http_tool.generate`: the same loop with the tool behind HTTP (a search or
  sandbox service), with timeouts and retries.
"""
