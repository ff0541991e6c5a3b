"""rlpost's launcher: compose a model, a recipe and a hardware profile, then plan or train.

    python launch.py                                                    # the CPU default run
    python launch.py model=glm4-9b recipe=grpo_dapo hardware=h100x8 mode=plan
    python launch.py model=qwen3-4b hardware=h100x8 mode=slime_args

The logic lives in rlpost.cli.launch.
"""

from rlpost.cli.launch import main

if __name__ == "__main__":
    main()
