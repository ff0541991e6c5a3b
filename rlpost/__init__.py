"""rlpost: declarative, config-first RL post-training for large language models."""

import time

__version__ = "0.1.0"

# When this process first imported rlpost (the launcher's first act): start-up is measured
# from here (perf/startup_time_s).
IMPORTED_AT = time.time()
