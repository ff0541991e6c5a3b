"""Why a reward could not be computed."""


class RewardError(RuntimeError):
    """A reward could not be computed: bad configuration, a failing hook or server."""


class RemoteRewardError(RewardError):
    """The reward server refused a request or stayed unreachable through every retry."""
