import asyncio
import threading

import pytest

from rlpost.rewards.answers import (
    answers_match,
    choice_label,
    chosen_letter,
    f1_score,
    grade_choice,
    grade_dapo,
    grade_deepscaler,
    grade_math,
    last_boxed,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}} done", "\\frac{\\sqrt{3}}{2}"),
        ("first \\boxed{1}, then \\boxed{2}", "2"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\fbox{7}", "7"),
        ("\\boxed 5$.", "5"),
        ("no box here: 42", None),
        ("cut off \\boxed{\\frac{1}{", None),
        ("\\boxed{3} and then \\boxed{", None),
    ],
)
def test_last_boxed_takes_the_last_balanced_box(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    ("response", "label", "reward"),
    [
        ("The answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{\\dfrac{3}{4}}", "3/4", 1.0),
        ("\\boxed{34.0}", "34", 1.0),
        ("\\boxed{1,000}", "1000", 1.0),
        ("\\boxed{10^{3}}", "1000", 1.0),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", 1.0),
        ("\\boxed{2\\pi}", "2\\pi", 1.0),
        ("\\boxed{x = 3}", "3", 1.0),
        ("\\boxed{\\left(\\frac{1}{2}\\right)}", "1/2", 1.0),
        ("\\boxed{\\{2, 1\\}}", "\\{1,2\\}", 1.0),
        ("\\boxed{\\text{Monday}}", "Monday", 1.0),
        ("\\boxed{5}", "\\boxed{5}", 1.0),
        ("\\boxed{34}", 34, 1.0),
        ("\\boxed{35}", "34", 0.0),
        ("\\boxed{0.3333}", "1/3", 0.0),
        ("the answer is 34", "34", 0.0),
        ("\\boxed{34} no wait, \\boxed{35}", "34", 0.0),
        ("\\boxed{35} no wait, \\boxed{34}", "34", 1.0),
        ("\\boxed{}", "34", 0.0),
    ],
)
def test_math_grading_truth_table(response: str, label: str, reward: float) -> None:
    assert grade_math(response, label) == reward


def test_deepscaler_counts_only_text_after_think() -> None:
    assert grade_deepscaler("<think>maybe \\boxed{4}</think> so \\boxed{5}", "5") == 1.0
    assert grade_deepscaler("<think>it is \\boxed{5}</think> the answer is 4", "5") == 0.0
    assert grade_deepscaler("no thinking block, \\boxed{5}", "5") == 0.0
    assert grade_deepscaler("<think>a</think>b</think>\\boxed{5}", "5") == 1.0


@pytest.mark.parametrize(
    ("response", "reward"),
    [
        ("Work...\nAnswer: 34", 1.0),
        ("Work...\nAnswer: $34$", 1.0),
        ("Work...\nanswer:34.\n", 1.0),
        ("Answer: 12\nLet me recheck.\nAnswer: 34\n<|im_end|>", 1.0),
        ("Answer: 34\nActually\nAnswer: 35", -1.0),
        ("Work...\nAnswer: \\boxed{34}", 1.0),
        ("the result is 34", -1.0),
        ("Answer:   \n34", -1.0),
    ],
)
def test_dapo_reads_the_last_answer_line_and_scores_plus_minus_one(
    response: str, reward: float
) -> None:
    assert grade_dapo(response, "34") == reward


def test_f1_is_token_overlap() -> None:
    assert f1_score("The Eiffel Tower!", "eiffel tower") == 1.0
    assert f1_score("paris france", "paris") == pytest.approx(2 / 3)
    assert f1_score("london", "paris") == 0.0
    assert f1_score("", "") == 1.0


def test_grading_works_off_the_main_thread() -> None:
    results: list[float] = []
    errors: list[BaseException] = []

    def grade() -> None:
        try:
            results.append(grade_math("\\boxed{\\frac{2}{4}}", "0.5"))
            results.append(grade_math("\\boxed{\\frac{2}{5}}", "0.5"))
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=grade)
    worker.start()
    worker.join()
    assert not errors
    assert results == [1.0, 0.0]


def test_grading_works_inside_an_event_loop_executor() -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        return await asyncio.gather(
            loop.run_in_executor(None, grade_math, "\\boxed{1/2}", "0.5"),
            loop.run_in_executor(None, answers_match, "\\sqrt{4}", "2"),
        )

    assert asyncio.run(main()) == [1.0, True]


def test_worker_protocol_reports_rewards_and_errors() -> None:
    from rlpost.rewards.worker import handle

    assert handle({"grader": "math", "response": "\\boxed{2}", "label": "2"}) == {"reward": 1.0}
    assert "unknown grader 'maths'" in handle({"grader": "maths"})["error"]
    assert "KeyError" in handle({"grader": "f1", "response": "x"})["error"]


@pytest.mark.parametrize(
    ("answer", "label"),
    [
        ("42", "42"), ("42", "43"), ("007", "7"), ("+5", "5"), ("-5", "5"), ("-0", "0"),
        ("$12$", "12"), (" 12 ", "$12$"), ("12", "\\boxed{12}"), ("10", "-10"),
        ("123456789012345678901", "123456789012345678901"),
        ("123456789012345678901", "123456789012345678902"),
    ],
)  # fmt: skip
def test_integers_are_compared_as_math_verify_compares_them(answer: str, label: str) -> None:
    """Plain integers skip math_verify's parser: the verdict is the one it gives."""
    import math_verify as mv

    def parsed(text: str) -> list[object]:
        text = text.strip().strip("$").strip()
        config = [mv.LatexExtractionConfig(), mv.ExprExtractionConfig()]
        return mv.parse(f"${text}$", extraction_config=config, parsing_timeout=None)

    gold = last_boxed(label) or label
    expected = mv.verify(parsed(gold), parsed(answer), timeout_seconds=None)
    assert answers_match(answer, label) is expected


@pytest.mark.parametrize(
    ("response", "chosen"),
    [
        ("The answer is (B).", "B"),
        ("Answer: **C**", "C"),
        ("so the correct option is D", "D"),
        ("Both A and B look right... \\boxed{\\text{A}}", "A"),
        ("\\boxed{(C) 42 meters}", "C"),
        ("I think it is A or B. Final answer: B", "B"),
        ("<think>the answer is A</think> On reflection, (C).", "C"),
        ("Answer: I think it is (D)", "D"),  # the pronoun is not option I
        ("I am not sure", None),
        ("the answer is a guess", None),  # a lower-case word is no option
        ("The answer is 42", None),
    ],
)
def test_the_chosen_option_is_what_the_response_settles_on(
    response: str, chosen: str | None
) -> None:
    assert chosen_letter(response) == chosen


def test_options_outside_the_question_are_not_chosen() -> None:
    assert chosen_letter("The answer is (E).", "ABCD") is None


@pytest.mark.parametrize(
    ("label", "metadata", "expected"),
    [
        ("b", {}, "B/ABCDEFGHIJ"),
        (2, {}, "C/ABCDEFGHIJ"),
        ("Paris", {"choices": ["London", "Paris", "Rome", "Oslo"]}, "B/ABCD/paris"),
        ("Rome", {"choices": {"A": "London", "B": "Paris", "C": "Rome"}}, "C/ABC/rome"),
        ("whatever", {"correct_letter": "d"}, "D/ABCDEFGHIJ"),
        ("c", {"valid_letters": ["A", "B", "C"]}, "C/ABC"),
        ("0", {"valid_letters": "xyz", "correct_answer": "The Moon."}, "X/XYZ/moon"),
    ],
)
def test_a_choice_label_is_a_letter_an_index_or_an_options_text(
    label: object, metadata: dict[str, object], expected: str
) -> None:
    assert choice_label(label, metadata) == expected


def test_a_label_that_names_no_option_says_what_it_should_be() -> None:
    with pytest.raises(ValueError, match="names no option: give its letter \\(A-D\\)"):
        choice_label("Madrid", {"choices": ["London", "Paris", "Rome", "Oslo"]})


def test_a_choice_is_graded_against_the_labelled_letter_among_the_options() -> None:
    label = choice_label("Paris", {"choices": ["London", "Paris", "Rome", "Oslo"]})
    assert grade_choice("The answer is (B)", label) == 1.0
    assert grade_choice("The answer is (C)", label) == 0.0
    assert grade_choice("I cannot tell", label) == 0.0
    # no letter named: the right option's words count, as whole words
    assert grade_choice("<think>London? No.</think> It is Paris.", label) == 1.0
    assert grade_choice("It is London.", label) == 0.0
    assert grade_choice("Parisian cafes", label) == 0.0
    assert grade_choice("The answer is (C), not Paris", label) == 0.0  # the letter decides


def test_letters_outside_valid_letters_are_no_answer() -> None:
    with pytest.raises(ValueError, match="names no option: give its letter \\(A-C\\)"):
        choice_label("D", {"valid_letters": ["A", "B", "C"]})
    label = choice_label("B", {"valid_letters": ["A", "B", "C"]})
    assert grade_choice("The answer is (D)", label) == 0.0
    assert grade_choice("The answer is (B)", label) == 1.0
