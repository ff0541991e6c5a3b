from pathlib import Path

import pytest

from rlpost.data import DataSource, PromptRecord, load_eval_groups
from rlpost.data.source import DataSourceError
from rlpost.runtime.evaluation import load_eval_sets
from rlpost.schema import DataConfig, RecipeConfig
from rlpost.types import Sample


def records(count: int) -> list[PromptRecord]:
    return [PromptRecord(i + 1, f"q{i}", (10, i), str(i), {"k": i}) for i in range(count)]


def source(count: int = 5, *, n: int = 2, shuffle: bool = True, seed: int = 42, **kw) -> DataSource:
    return DataSource.of_prompts(
        records(count), n_samples_per_prompt=n, shuffle=shuffle, seed=seed, **kw
    )


def labels(groups: list[list[Sample]]) -> list[str]:
    return [group[0].label for group in groups]


def test_groups_hold_n_independent_samples_of_one_prompt() -> None:
    groups = source(3, n=4, shuffle=False).next_groups(2)
    assert [len(g) for g in groups] == [4, 4]
    first = groups[0]
    assert {s.label for s in first} == {"0"}
    assert [s.group_index for s in first] == [0] * 4
    assert [s.index for s in first] == [0, 1, 2, 3]
    assert [s.index for s in groups[1]] == [4, 5, 6, 7]
    first[0].prompt_ids.append(99)
    first[0].metadata["k"] = "changed"
    assert first[1].prompt_ids == [10, 0]
    assert first[1].metadata == {"k": 0}


def test_shuffle_is_deterministic_per_seed() -> None:
    order = labels(source(seed=1).next_groups(5))
    assert order == labels(source(seed=1).next_groups(5))
    assert sorted(order) == ["0", "1", "2", "3", "4"]
    assert order != labels(source(seed=2).next_groups(5))
    assert labels(source(shuffle=False).next_groups(5)) == ["0", "1", "2", "3", "4"]


def test_epochs_are_crossed_inside_one_call_and_reshuffled() -> None:
    data = source(5)
    groups = data.next_groups(3) + data.next_groups(9)
    epochs = [labels(groups[i : i + 5]) for i in (0, 5)]
    assert all(sorted(e) == ["0", "1", "2", "3", "4"] for e in epochs)
    assert epochs[0] != epochs[1]  # epoch 1 uses seed + 1
    assert data.state() == {"epoch": 2, "offset": 2, "seed": 42}
    indices = [g[0].group_index for g in groups]
    assert indices == list(range(12))


def test_resume_from_state_continues_identically() -> None:
    run = source(7, seed=3)
    run.next_groups(4)
    run.next_groups(5)
    saved = run.state()
    expected = run.next_groups(6)

    resumed = source(7, seed=3)
    resumed.load_state(saved)
    again = resumed.next_groups(6)
    assert labels(again) == labels(expected)
    assert [g[0].group_index for g in again] == [g[0].group_index for g in expected]


def test_resume_keeps_the_saved_seed_and_rejects_a_position_past_the_data() -> None:
    run = source(5, seed=3)
    run.next_groups(2)
    state = run.state()
    other = source(5, seed=99)
    other.load_state(state)
    assert labels(other.next_groups(3)) == labels(run.next_groups(3))
    with pytest.raises(ValueError, match="prompt file or max_prompt_len changed"):
        source(5).load_state({"epoch": 0, "offset": 9, "seed": 42})


def test_buffered_groups_come_first_and_keep_their_start_rollout() -> None:
    data = source(5, shuffle=False)
    first = data.next_groups(3)
    data.add_to_buffer(first[1:], rollout_id=7)
    taken = data.next_groups(3, rollout_id=8)
    assert labels(taken) == ["1", "2", "3"]
    assert taken[0] is first[1]
    assert all(s.metadata["start_rollout_id"] == 7 for g in taken[:2] for s in g)
    assert "start_rollout_id" not in taken[2][0].metadata
    assert data.buffer == []
    assert data.state()["offset"] == 4


def test_buffer_larger_than_the_request_is_drained_in_order() -> None:
    data = source(5, shuffle=False)
    data.add_to_buffer(data.next_groups(4))
    assert labels(data.next_groups(3)) == ["0", "1", "2"]
    assert labels(data.next_groups(3)) == ["3", "4", "0"]


def test_a_filter_that_keeps_what_it_returns_cannot_hand_groups_out_twice(
    hook_modules: Path,
) -> None:
    data = source(5, shuffle=False, buffer_filter="rlpost_test_hooks.keep_everything")
    data.add_to_buffer(data.next_groups(2))
    assert labels(data.next_groups(1)) == ["0"]
    assert labels(data.buffer) == ["1"]


def test_a_buffer_filter_that_hands_out_samples_instead_of_groups_is_named(
    hook_modules: Path,
) -> None:
    data = source(5, shuffle=False, buffer_filter="rlpost_test_hooks.takes_samples")
    data.add_to_buffer(data.next_groups(2))
    with pytest.raises(DataSourceError) as info:
        data.next_groups(1)
    message = str(info.value)
    assert message.startswith("buffer filter 'rlpost_test_hooks.takes_samples' returned [Sample(")
    assert message.endswith(
        "; it returns a list of at most 1 of the groups in the buffer it is given (each a list "
        "of Samples, as the buffer holds them), removing them from it"
    )


def test_from_config_and_eval_groups(write_jsonl, chat_tokenizer) -> None:
    rows = [{"prompt": f"what is {i} times 2?", "answer": str(2 * i)} for i in range(4)]
    path = write_jsonl(rows)
    config = DataConfig(
        prompt_data=str(path),
        input_key="prompt",
        label_key="answer",
        apply_chat_template=True,
        shuffle=True,
        seed=5,
    )
    data = DataSource.from_config(config, chat_tokenizer, n_samples_per_prompt=3)
    assert len(data) == 4 and data.num_dropped == 0
    assert sorted(labels(data.next_groups(4))) == ["0", "2", "4", "6"]

    eval_rows = [{"question": f"what is {i} times 3?", "label": str(3 * i)} for i in range(3)]
    eval_path = write_jsonl(eval_rows, name="eval.jsonl")
    groups = load_eval_groups(
        eval_path,
        config,
        chat_tokenizer,
        n_samples_per_prompt=16,
        input_key="question",
        label_key="label",
    )
    assert labels(groups) == ["0", "3", "6"]  # file order, never shuffled
    assert [len(g) for g in groups] == [16, 16, 16]
    assert chat_tokenizer.decode(groups[1][0].prompt_ids).startswith("<|im_start|>user\nwhat")


def test_an_eval_dataset_reads_its_own_tool_key_or_the_data_sections(
    write_jsonl, tools_tokenizer
) -> None:
    train = write_jsonl([{"prompt": "what is 2 times 3?", "label": "6"}])
    tool = {"type": "function", "function": {"name": "multiply"}}
    other = {"type": "function", "function": {"name": "search"}}
    eval_path = write_jsonl(
        [{"prompt": "what is 4 times 5?", "label": "20", "fns": [tool], "tools": [other]}],
        name="eval.jsonl",
    )
    recipe = RecipeConfig.model_validate(
        {
            "name": "tools",
            "data": {
                "prompt_data": str(train),
                "input_key": "prompt",
                "label_key": "label",
                "apply_chat_template": True,
            },
            "rollout": {
                "num_rollout": 1,
                "batch_size": 1,
                "n_samples_per_prompt": 2,
                "max_response_len": 8,
            },
            "train": {"global_batch_size": 2},
            "eval": {
                "interval": 1,
                "datasets": [
                    {"name": "own", "path": str(eval_path), "tool_key": "fns"},
                    {"name": "data", "path": str(eval_path)},
                ],
            },
        }
    )
    own, data = load_eval_sets(recipe, tools_tokenizer, stop_token_ids=[])
    assert own.groups[0][0].metadata["tools"] == [tool]
    assert data.groups[0][0].metadata["tools"] == [other]  # the data section's "tools"
    assert '"multiply"' in tools_tokenizer.decode(own.groups[0][0].prompt_ids)


def feedback_config(path: Path, **settings: object) -> DataConfig:
    return DataConfig(
        prompt_data=str(path),
        input_key="prompt",
        label_key="answer",
        apply_chat_template=True,
        source="rlpost_test_hooks.FeedbackSource",
        source_settings=settings,
    )


def rewarded(groups: list[list[Sample]], rewards: list[float]) -> list[list[Sample]]:
    for group, reward in zip(groups, rewards, strict=True):
        for sample in group:
            sample.reward = reward
    return groups


def test_a_data_source_class_draws_learns_from_what_was_trained_and_resumes(
    hook_modules: Path, write_jsonl, chat_tokenizer
) -> None:
    rows = [{"prompt": f"what is {i} times 2?", "answer": str(2 * i)} for i in range(6)]
    config = feedback_config(write_jsonl(rows), max_repeats=1)
    data = DataSource.from_config(config, chat_tokenizer, n_samples_per_prompt=2)
    first = data.next_groups(3)
    assert labels(first) == ["0", "2", "4"] and [len(g) for g in first] == [2, 2, 2]
    assert chat_tokenizer.decode(first[0][0].prompt_ids).startswith("<|im_start|>user\nwhat")
    data.trained(rewarded(first, [1.0, 0.0, 1.0]))  # the second fell below the median
    saved = data.state()
    expected = labels(data.next_groups(3))
    assert expected == ["2", "6", "8"]  # asked again first, then on in file order

    resumed = DataSource.from_config(config, chat_tokenizer, n_samples_per_prompt=2)
    resumed.load_state(saved)
    again = resumed.next_groups(3)
    assert labels(again) == expected
    assert [g[0].group_index for g in again] == [3, 4, 5]


class ShortSource:
    def __init__(self, ctx: object) -> None:
        self.ctx = ctx

    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        return [self.ctx.make_group(0, "q") for _ in range(num_groups)]  # type: ignore[attr-defined]

    def add_samples(self, groups: list[list[Sample]]) -> None: ...

    def state_dict(self) -> dict[str, object]:
        return {}

    def load_state_dict(self, state: dict[str, object]) -> None: ...


def test_what_a_source_returns_is_checked(chat_tokenizer) -> None:
    from rlpost.data.prompts import prompt_format
    from rlpost.data.source import DataSourceError, SourceContext

    config = DataConfig(prompt_data="unused.jsonl")
    ctx = SourceContext({}, chat_tokenizer, prompt_format(config), 2, seed=0)
    data = DataSource(ShortSource(ctx))
    assert len(data.next_groups(1)) == 1
    with pytest.raises(DataSourceError, match="group index 0 twice"):
        data.next_groups(1)
    with pytest.raises(ValueError, match="message list, which needs the chat template"):
        ctx.make_group(1, [{"role": "user", "content": "q"}])


def test_a_source_class_whose_constructor_raises_is_named_with_what_it_was_given(
    hook_modules: Path, chat_tokenizer, tmp_path: Path
) -> None:
    missing = tmp_path / "feedback.jsonl"
    with pytest.raises(DataSourceError) as info:
        DataSource.from_config(
            feedback_config(missing, max_repeats=3), chat_tokenizer, n_samples_per_prompt=2
        )
    assert str(info.value).startswith(
        "data source 'rlpost_test_hooks.FeedbackSource' could not be built: "
        "FeedbackSource(ctx) raised FileNotFoundError: "
    )
    assert str(info.value).endswith(
        f"(ctx.settings, recipe.data.source_settings: {{'max_repeats': 3}}; "
        f"ctx.prompt_data: '{missing}')"
    )


def test_an_eval_sets_reward_type_grades_every_line_of_it(write_jsonl, chat_tokenizer) -> None:
    path = write_jsonl(
        [
            {"prompt": "Capital of France? A) Paris B) Rome", "label": "A"},
            {"prompt": "1+1?", "label": "2", "metadata": {"rm_type": "math"}},
        ]
    )
    recipe = RecipeConfig.model_validate(
        {
            "name": "r",
            "data": {"prompt_data": str(path), "input_key": "prompt", "label_key": "label"},
            "rollout": {"num_rollout": 1, "batch_size": 1, "n_samples_per_prompt": 2,
                        "max_response_len": 8},
            "train": {"global_batch_size": 2},
            "eval": {"datasets": [{"name": "mixed", "path": str(path), "reward_type": "gpqa"}]},
        }
    )  # fmt: skip
    (mixed,) = load_eval_sets(recipe, chat_tokenizer, stop_token_ids=[])
    assert [group[0].metadata["rm_type"] for group in mixed.groups] == ["gpqa", "gpqa"]


def test_an_eval_sets_reward_type_grades_it_beside_a_custom_function(
    write_jsonl, chat_tokenizer, hook_modules
) -> None:
    """A custom function scores every training sample before any rm_type (slime's order),
    and an evaluation set that names its own reward_type is graded by that type all the
    same: the set is scored with a reward config of its type and no custom function."""
    import asyncio

    from rlpost.rewards import compute_rewards

    path = write_jsonl([{"prompt": "1+1?", "label": "2"}])
    recipe = RecipeConfig.model_validate(
        {
            "name": "r",
            "data": {"prompt_data": str(path), "input_key": "prompt", "label_key": "label"},
            "rollout": {"num_rollout": 1, "batch_size": 1, "n_samples_per_prompt": 2,
                        "max_response_len": 8,
                        "reward": {"custom_function": "rlpost_test_hooks.length_reward"}},
            "train": {"global_batch_size": 2},
            "eval": {"datasets": [{"name": "own", "path": str(path), "reward_type": "math"},
                                  {"name": "as_training", "path": str(path)}]},
        }
    )  # fmt: skip
    own, as_training = load_eval_sets(recipe, chat_tokenizer, stop_token_ids=[])
    assert as_training.reward is None  # scored as training is: by the custom function
    assert own.reward is not None
    assert (own.reward.type, own.reward.custom_function) == ("math", None)
    (answer,) = [s.fresh() for s in own.groups[0][:1]]
    answer.response_text = "so \\boxed{2}"
    assert asyncio.run(compute_rewards([answer], own.reward)) == [1.0]
    training = asyncio.run(compute_rewards([answer], recipe.rollout.reward))
    assert training == [float(len("so \\boxed{2}"))]  # the line's rm_type aside


def test_a_source_classs_group_carries_tools_into_its_prompt_and_metadata(
    tools_tokenizer, tiny_tokenizer
) -> None:
    """A data source's tools reach the chat template as a prompt file's tools column does;
    a template that would drop them is refused."""
    from rlpost.data.prompts import prompt_format
    from rlpost.data.source import SourceContext

    config = DataConfig(prompt_data="unused.jsonl", apply_chat_template=True)
    tools = [{"type": "function", "function": {"name": "multiply", "parameters": {}}}]
    ctx = SourceContext({}, tools_tokenizer, prompt_format(config), 2, seed=0)
    group = ctx.make_group(0, "What is 6 x 7?", label="42", tools=tools)
    assert '"multiply"' in tools_tokenizer.decode(group[0].prompt_ids)
    assert group[1].metadata == {"tools": tools}
    plain = ctx.make_group(1, "What is 6 x 7?")
    assert '"multiply"' not in tools_tokenizer.decode(plain[0].prompt_ids)
    ignoring = SourceContext({}, tiny_tokenizer, prompt_format(config), 2, seed=0)
    with pytest.raises(ValueError, match="chat template does not render tools"):
        ignoring.make_group(0, "What is 6 x 7?", tools=tools)


class LengthsSource:
    """Prompts of the given word counts, in turn, each a new group."""

    def __init__(self, ctx: object, words: list[int]) -> None:
        self.ctx, self.words, self.drawn = ctx, words, 0

    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        groups = []
        for _ in range(num_groups):
            count = self.words[self.drawn % len(self.words)]
            prompt = " ".join(["word"] * count)
            groups.append(self.ctx.make_group(self.drawn, prompt))  # type: ignore[attr-defined]
            self.drawn += 1
        return groups

    def add_samples(self, groups: list[list[Sample]]) -> None: ...

    def state_dict(self) -> dict[str, object]:
        return {"drawn": self.drawn}

    def load_state_dict(self, state: dict[str, object]) -> None: ...


def test_a_source_classs_prompts_over_max_prompt_len_are_dropped_and_replaced(
    chat_tokenizer,
) -> None:
    from rlpost.data.prompts import prompt_format
    from rlpost.data.source import MAX_DROPPED_DRAWS, DataSourceError, SourceContext

    config = DataConfig(prompt_data="unused.jsonl")
    ctx = SourceContext({}, chat_tokenizer, prompt_format(config), 2, seed=0)
    short, long = len(ctx.make_group(0, "word word")[0].prompt_ids), 40
    data = DataSource(LengthsSource(ctx, [2, long, long, 2, 2]), max_prompt_len=short)
    groups = data.next_groups(4)
    assert [len(g[0].prompt_ids) for g in groups] == [short] * 4
    assert [g[0].group_index for g in groups] == [0, 3, 4, 5]  # 1 and 2 dropped, drawn again
    assert data.num_dropped == 2
    unlimited = DataSource(LengthsSource(ctx, [2, long]))
    assert [g[0].group_index for g in unlimited.next_groups(2)] == [0, 1]
    hopeless = DataSource(LengthsSource(ctx, [long]), max_prompt_len=short)
    with pytest.raises(DataSourceError, match=r"longer than recipe\.data\.max_prompt_len"):
        hopeless.next_groups(3)
    assert hopeless.source.drawn == MAX_DROPPED_DRAWS * 3  # type: ignore[attr-defined]


def test_a_source_class_is_told_shuffle_and_max_prompt_len(
    hook_modules: Path, write_jsonl, chat_tokenizer
) -> None:
    rows = [{"prompt": "what is 1 times 2?", "answer": "2"}]
    config = feedback_config(write_jsonl(rows)).model_copy(
        update={"shuffle": True, "max_prompt_len": 64}
    )
    data = DataSource.from_config(config, chat_tokenizer, n_samples_per_prompt=2)
    ctx = data.source.ctx  # type: ignore[attr-defined]
    assert (ctx.shuffle, ctx.max_prompt_len, data.max_prompt_len) == (True, 64, 64)


def test_an_eval_sets_response_length_is_its_own_else_the_sections_else_the_rollouts(
    tmp_path: Path,
) -> None:
    """One precedence for the requests (eval_response_len) and the plan (response_lens)."""
    from rlpost.runtime.evaluation import eval_response_len

    (tmp_path / "p.jsonl").write_text('{"prompt": "q", "label": "a"}\n')
    sets = [
        {"name": "own", "path": str(tmp_path / "p.jsonl"), "max_response_len": 32},
        {"name": "other", "path": str(tmp_path / "p.jsonl")},
    ]

    def recipe(**eval_section: object) -> RecipeConfig:
        return RecipeConfig.model_validate(
            {
                "name": "lens",
                "data": {
                    "prompt_data": str(tmp_path / "p.jsonl"),
                    "input_key": "prompt",
                    "label_key": "label",
                },
                "rollout": {
                    "num_rollout": 1,
                    "batch_size": 1,
                    "n_samples_per_prompt": 2,
                    "max_response_len": 8,
                },
                "train": {"global_batch_size": 2},
                "eval": {"interval": 1, "datasets": sets, **eval_section},
            }
        )

    with_section, without = recipe(max_response_len=16), recipe()
    assert [eval_response_len(with_section, i) for i in (0, 1)] == [
        ("recipe.eval.datasets.0.max_response_len", 32),
        ("recipe.eval.max_response_len", 16),
    ]
    assert [eval_response_len(without, i) for i in (0, 1)] == [
        ("recipe.eval.datasets.0.max_response_len", 32),
        ("recipe.rollout.max_response_len", 8),
    ]
    assert with_section.eval.response_lens() == [
        ("eval.datasets.0.max_response_len", 32),
        ("eval.max_response_len", 16),
    ]
    assert without.eval.response_lens() == [("eval.datasets.0.max_response_len", 32)]
