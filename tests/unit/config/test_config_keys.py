"""The schema's key tree: what paths exist, how pydantic locations map to them, what fields take."""

from __future__ import annotations

from rlpost.config.keys import (
    PEER_NAMES,
    all_key_paths,
    describe_field,
    find_unknown,
    peer_names,
    resolve_loc,
)
from rlpost.schema import PlanOptions, RolloutConfig, RolloutLayout, TrainLayout


def test_known_paths_walk_sections_lists_and_dicts() -> None:
    for path in (
        "mode",
        "recipe.rollout.reward.custom_function",
        "model.moe.top_k",  # an optional section
        "recipe.eval.datasets.3.max_response_len",  # a list of sections
        "layout.rollout.sglang.mem_fraction_static",  # a free-form mapping
        "recipe.data.apply_chat_template_kwargs.enable_thinking.deeper",
    ):
        assert find_unknown(path) is None, path


def test_unknown_paths_say_where_they_leave_the_schema() -> None:
    unknown = find_unknown("recipe.rollout.temprature")
    assert unknown is not None
    assert (unknown.parent, unknown.name) == ("recipe.rollout", "temprature")
    assert "temperature" in unknown.choices
    assert unknown.suggestion() == " Did you mean 'temperature'?"
    top = find_unknown("modle.name")
    assert top is not None and top.parent == "" and "at the top level" in top.describe()
    index = find_unknown("recipe.eval.datasets.first")
    assert index is not None and index.name == "first"


def test_a_name_used_in_two_sections_suggests_both() -> None:
    unknown = find_unknown("recipe.temperature")
    assert unknown is not None
    assert unknown.candidates() == ["recipe.rollout.temperature", "recipe.eval.temperature"]


def test_a_key_named_in_another_section_points_there() -> None:
    """A key of another section's name, or of a close spelling of one, is pointed at that
    key: a loose likeness to a sibling (run.dump_rollouts for run.num_rollout) does not hide
    it, and a typo of a sibling still names the sibling."""
    exact = find_unknown("run.num_rollout")
    assert exact is not None and exact.candidates() == ["recipe.rollout.num_rollout"]
    assert exact.suggestion() == " Did you mean 'recipe.rollout.num_rollout'?"
    near = find_unknown("recipe.loop.num_rollouts")
    assert near is not None and near.candidates() == ["recipe.rollout.num_rollout"]
    assert near.fix() == "use recipe.rollout.num_rollout instead, or remove the key"
    sibling = find_unknown("recipe.loop.max_stalenes")
    assert sibling is not None and sibling.suggestion() == " Did you mean 'max_staleness'?"
    far = find_unknown("recipe.loop.warmup")
    assert far is not None and far.candidates() == []


def test_every_listed_path_is_known() -> None:
    paths = all_key_paths()
    assert "recipe.rollout.temperature" in paths and "layout.train.recompute.granularity" in paths
    assert all(find_unknown(path) is None for path in paths)


def test_resolve_loc_drops_pydantic_tags() -> None:
    loc = resolve_loc(("layout", "train", "tp", "int"))
    assert loc.key == "layout.train.tp" and loc.section is TrainLayout
    assert (
        resolve_loc(("recipe", "eval", "datasets", 0, "path")).key == "recipe.eval.datasets.0.path"
    )
    assert (
        resolve_loc(("layout", "rollout", "sglang", "dp_size")).key
        == "layout.rollout.sglang.dp_size"
    )


def test_describe_field_states_type_range_and_null() -> None:
    assert describe_field(TrainLayout.model_fields["tp"]) == "an integer > 0, or null"
    assert describe_field(RolloutConfig.model_fields["top_p"]) == "a number > 0.0 and <= 1.0"
    assert describe_field(PlanOptions.model_fields["format"]) == (
        "one of 'table', 'json', 'script'"
    )
    assert describe_field(RolloutConfig.model_fields["stop"]) == "a list of strings"
    assert describe_field(RolloutLayout.model_fields["sglang"]) == "a mapping"


def test_other_frameworks_names_point_at_the_key_they_stand_for() -> None:
    """verl's, TRL's, OpenRLHF's and slime's names for rlpost's keys: each target exists, and
    the suggestion names it (not the closest spelling: max_new_tokens is closest to
    max_turns), with what differs."""
    paths = set(all_key_paths())
    for name, (key, _) in peer_names().items():
        assert key in paths, (name, key)
    assert set(PEER_NAMES) < set(peer_names())
    tis = find_unknown("recipe.algo.use_tis")
    assert tis is not None and tis.candidates() == ["recipe.algo.off_policy_correction"]
    assert "('use_tis' is slime's name for it; the value is tis)" in tis.describe()
    unknown = find_unknown("recipe.rollout.max_new_tokens")
    assert unknown is not None and unknown.candidates() == ["recipe.rollout.max_response_len"]
    agg = find_unknown("recipe.algo.loss_agg_mode")
    assert agg is not None
    assert "seq-mean-token-mean is sample_mean" in agg.describe()
    assert agg.fix() == "use recipe.algo.loss_reduction instead, or remove the key"
