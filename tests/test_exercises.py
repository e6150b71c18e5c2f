"""
Tests for the exercises in exercises/: each exercise's check (exercises/checks.py) compares an
answer with lime.py's own code and says in a line what is wrong when they differ. By default they
check the repo's answers (exercises/answers.py); LIME_EXERCISES points them at another file, a
student's:

    python -m pytest -q tests/test_exercises.py
    LIME_EXERCISES=exercises/student.py python -m pytest -q tests/test_exercises.py

The same checks also run on exercises/wrong.py, typical wrong answers, and must reject each with
a line that names its mistake: a check that cannot fail proves nothing. A student's copy
(python -m lab.handout) has neither answers.py nor wrong.py: the tests that need them skip there,
saying why, and the student's command runs the six checks alone. (exercise 6's experiment,
exercises/ablation.py, has its own tests: tests/test_ablation.py.)
"""
import inspect
import os
import types

import pytest
import torch

import lime
from exercises import ROOT, load
from exercises.checks import EXERCISES, verdict


def check(module, name, path):
    """Run exercise name's check on module's answer; a failure names the exercise and says what
    is wrong in a line, without a traceback through the checks."""
    message = verdict(module, name, path)
    if message is not None:
        pytest.fail(f"{name}: {message}", pytrace=False)


@pytest.fixture(autouse=True)
def one_thread():
    """One thread: on tensors this small a second thread costs more to wake than it saves."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -----------------------------------------------------------------------------
# The tests


def exercises_file(name, needed_by):
    """exercises/name, loaded; where this copy lacks it (a student's, from python -m lab.handout,
    or a clone with it deleted), the test skips, saying why."""
    path = ROOT / 'exercises' / name
    if not path.is_file():
        pytest.skip(f"exercises/{name} is not in this copy (a student's handout leaves it out): "
                    f"{needed_by}")
    return load(path)


def student_answers(path):
    """The file LIME_EXERCISES names, loaded; one line where it cannot be."""
    try:
        return load(path)
    except FileNotFoundError as e:
        pytest.fail(f"LIME_EXERCISES={path}: {e}", pytrace=False)
    except SyntaxError as e:
        pytest.fail(f"{path}, line {e.lineno}: {e.msg}", pytrace=False)


@pytest.mark.parametrize('name', EXERCISES)
def test_answer_passes_the_check(name):
    path = os.environ.get('LIME_EXERCISES')
    if path is None:
        path = 'exercises/answers.py'
        answers = exercises_file('answers.py', "check your own answers: LIME_EXERCISES="
                                 "exercises/student.py python -m pytest -q tests/test_exercises.py")
    else:
        answers = student_answers(path)
    check(answers, name, path)


# Each answer in exercises/wrong.py: (its exercise, the words of the message that name its mistake).
WRONG_ANSWERS = {
    'static_mix': ('static_mix', "R's columns are read head by head"),
    'static_mix_with_blocks_transposed': ('static_mix', "(G, G) block of R is transposed"),
    'static_mix_from_layer_1': ('static_mix', "layer 0 is left out of the mix"),
    'static_mix_through_lime': ('static_mix', "calls lime.py's StaticRouter.forward"),
    'dynamic_probs': ('dynamic_probs', "the softmax runs over the heads"),
    'dynamic_probs_over_time': ('dynamic_probs', "the softmax runs over time"),
    'dynamic_probs_over_all_outputs': ('dynamic_probs', "one softmax for all heads, then split"),
    'dynamic_probs_without_bias': ('dynamic_probs', "without proj's bias: call proj(h)"),
    'router_cost': ('router_cost', "does the mix cover the values as well as the keys?"),
    'router_cost_with_head_size_per_kv_head': ('router_cost',
                                               "the count for a head size of n_embd // n_kv_head"),
    'router_cost_by_difference': ('router_cost', "calls lime.py's GPT.num_params"),
    'top_p_mask': ('top_p_mask', "the entry that takes the kept share to p or past it is kept"),
    'top_p_mask_keeps_every_tie': ('top_p_mask', "among equal weights the lower index ranks first"),
    'top_p_mask_keeps_no_zero_row': ('top_p_mask', "a row of zeros keeps every entry"),
    'top_p_mask_in_sorted_order': ('top_p_mask', "your mask is in sorted order, largest first"),
    'top_p_mask_of_bools': ('top_p_mask', "returns torch.bool, not the weights' dtype"),
    'top_p_mask_in_float32': ('top_p_mask', "returns torch.float32, not the weights' dtype"),
    'top_p_mask_from_lime': ('top_p_mask', "calls lime.py's top_p_mask"),
    'top_p_mask_from_lime_renamed': ('top_p_mask', "calls lime.py's top_p_mask"),
    'cached_attention': ('cached_attention', "the cache holds the layer's own keys, not its router's"),
    'cached_attention_without_gqa': ('cached_attention', "grouped-query attention is forgotten"),
    'cached_attention_with_q_alone_transposed': ('cached_attention',
                                                 "is (B, P + 1, G, hs), time before heads"),
    'cached_attention_with_rope_in_memory': ('cached_attention',
                                             "is RoPE applied before they go in?"),
    'cached_attention_through_lime': ('cached_attention',
                                      "calls lime.py's CausalSelfAttention.forward"),
    'cached_attention_calls_the_layer': ('cached_attention', "forward (which attn(...) runs)"),
    'RestrictedRouter': ('RestrictedRouter', "it counts its own layer among the last k"),
    'RestrictedRouterFirstFromLayer1': ('RestrictedRouter', "which='first' reads layers 1..2"),
    'RestrictedRouterWithoutItsOwnLayer': ('RestrictedRouter', "it leaves out its own layer, 5"),
    'RestrictedRouterReadingItsOwnLayerTwice': ('RestrictedRouter', "it reads a layer twice"),
    'RestrictedRouterWithoutTopP': ('RestrictedRouter', "as if router_top_p were 1"),
}
WRONG_NEEDED = "it holds the wrong answers that prove the checks can fail"


def rejection(wrong):
    """The line the check gives exercises/wrong.py's answer named wrong."""
    exercise, _ = WRONG_ANSWERS[wrong]
    answer = getattr(exercises_file('wrong.py', WRONG_NEEDED), wrong)
    with pytest.raises(pytest.fail.Exception) as failed:
        check(types.SimpleNamespace(**{exercise: answer}), exercise, 'exercises/wrong.py')
    return str(failed.value)


@pytest.mark.parametrize('wrong', WRONG_ANSWERS)
def test_check_rejects_the_typical_wrong_answer_in_one_line_that_names_it(wrong):
    exercise, words = WRONG_ANSWERS[wrong]
    message = rejection(wrong)
    assert message.startswith(f"{exercise}: ") and words in message, message
    assert '\n' not in message, message


def test_a_rejections_numbers_are_the_same_at_every_run():
    # The checks draw their cases from a seed of their own, whatever torch's state before.
    torch.manual_seed(1)
    first = rejection('static_mix_from_layer_1'), rejection('top_p_mask')
    torch.manual_seed(2)
    torch.rand(10)
    assert (rejection('static_mix_from_layer_1'), rejection('top_p_mask')) == first


def test_every_wrong_answer_is_checked_and_every_exercise_has_one():
    wrong = exercises_file('wrong.py', WRONG_NEEDED)
    defined = {name for name, value in vars(wrong).items()
               if callable(value) and getattr(value, '__module__', None) == wrong.__name__}
    assert defined == set(WRONG_ANSWERS)
    assert {exercise for exercise, _ in WRONG_ANSWERS.values()} == set(EXERCISES)


def test_an_answer_that_is_lime_pys_own_function_is_refused():
    # `from lime import top_p_mask` in place of an answer: it passes every other check.
    with pytest.raises(pytest.fail.Exception, match="top_p_mask: it calls lime.py's top_p_mask"):
        check(types.SimpleNamespace(top_p_mask=lime.top_p_mask), 'top_p_mask', 'a student file')


def test_an_answer_that_raises_is_told_what_and_where_in_one_line(tmp_path):
    mine = tmp_path / 'mine.py'
    mine.write_text("def static_mix(R, memory):\n    return R @ memory\n")  # a list, not a tensor
    message = verdict(load(mine), 'static_mix', 'mine.py')
    assert message.startswith("it raised TypeError at line 2 of mine.py: "), message
    assert '\n' not in message


def test_an_unwritten_exercise_says_not_written_yet():
    def static_mix(R, memory):  # as exercises/student.py hands it out
        raise NotImplementedError

    unwritten = types.SimpleNamespace(static_mix=static_mix)
    with pytest.raises(pytest.fail.Exception, match='static_mix: not written yet'):
        check(unwritten, 'static_mix', 'exercises/student.py')


def test_student_file_has_each_exercise_with_the_answers_signature_and_docstring():
    answers = exercises_file('answers.py', "this test compares exercises/student.py with it")
    student = load('exercises/student.py')
    for name in EXERCISES:
        mine, theirs = getattr(student, name, None), getattr(answers, name)
        assert mine is not None, f"exercises/student.py has no {name}"
        assert inspect.signature(mine) == inspect.signature(theirs), f"{name}: signatures differ"
        assert mine.__doc__ == theirs.__doc__, f"{name}: student.py's docstring is not answers.py's"
