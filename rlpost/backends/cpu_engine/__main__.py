"""Entry point: python -m rlpost.backends.cpu_engine --model-path DIR --port P."""

from rlpost.backends.cpu_engine.server import main

if __name__ == "__main__":
    main()
