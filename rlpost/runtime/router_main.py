"""`python -m sglang_router.launch_router`, with the engines' key read from the environment.

The router authorizes to its workers with `--api-key` (its only way in): given on the command
line, any local user could read it from `ps`. This entry point takes the same arguments and
sets the key from $RLPOST_ENGINE_KEY instead.
"""

from __future__ import annotations

import os
import sys

from sglang_router.launch_router import (  # type: ignore[import-untyped]
    launch_router,
    parse_router_args,
)

from rlpost.backends.engine_key import ENGINE_KEY_ENV


def main() -> None:
    args = parse_router_args(sys.argv[1:])
    key = os.environ.pop(ENGINE_KEY_ENV, None)
    if key:
        args.api_key = key
    launch_router(args)


if __name__ == "__main__":
    main()
