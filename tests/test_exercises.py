"""
The exercises' checks (exercises/checks.py): on the repo's answers, or with LIME_EXERCISES on a
student's file (-k NAME: one exercise's); and on tests/exercise_mistakes.py's wrong answers, each
of which its check must reject in one line that names its mistake. A student's copy (python -m
lab.handout) has neither those nor the answers: the tests that need them skip there.
"""
import inspect
import os
import types
from pathlib import Path

import pytest
import torch

from exercises import ROOT, load
from exercises.checks import EXERCISES, verdict

ANSWERS = ROOT / 'exercises' / 'answers.py'
MISTAKES_FILE = Path(__file__).with_name('exercise_mistakes.py')
MISTAKES = load(MISTAKES_FILE).MISTAKES if MISTAKES_FILE.is_file() else {}
NOT_IN_THIS_COPY = "is not in this copy (a student's handout leaves it out)"


def check(module, name, path):
    """Exercise name's check on module's answer; a failure names the exercise and says what is
    wrong in a line, without a traceback through the checks."""
    message = verdict(module, name, path)
    if message is not None:
        pytest.fail(f"{name}: {message}", pytrace=False)


@pytest.mark.parametrize('name', EXERCISES)
def test_answer_passes_the_check(name):
    path = os.environ.get('LIME_EXERCISES', 'exercises/answers.py')
    if path == 'exercises/answers.py' and not ANSWERS.is_file():
        pytest.skip(f"exercises/answers.py {NOT_IN_THIS_COPY}: check your own answers with "
                    "LIME_EXERCISES=exercises/student.py")
    try:
        answers = load(path)
    except (FileNotFoundError, SyntaxError) as e:
        pytest.fail(f"LIME_EXERCISES={path}: {e}", pytrace=False)
    check(answers, name, path)


def rejection(mistake):
    """The line the check gives the wrong answer named mistake."""
    exercise, answer, _ = MISTAKES[mistake]
    with pytest.raises(pytest.fail.Exception) as failed:
        check(types.SimpleNamespace(**{exercise: answer}), exercise, 'exercise_mistakes.py')
    return str(failed.value)


@pytest.mark.skipif(not MISTAKES, reason=f"tests/exercise_mistakes.py {NOT_IN_THIS_COPY}")
@pytest.mark.parametrize('mistake', MISTAKES or ['none'])
def test_the_check_rejects_a_wrong_answer_in_one_line_that_names_its_mistake(mistake):
    exercise, _, words = MISTAKES[mistake]
    message = rejection(mistake)
    assert message.startswith(f"{exercise}: ") and words in message, message
    assert '\n' not in message, message


@pytest.mark.skipif(not MISTAKES, reason=f"tests/exercise_mistakes.py {NOT_IN_THIS_COPY}")
def test_every_exercise_has_a_wrong_answer_and_a_rejection_is_the_same_at_every_run():
    assert {exercise for exercise, _, _ in MISTAKES.values()} == set(EXERCISES)
    torch.manual_seed(1)
    first = rejection('static mix without layer 0'), rejection('top-p short of p')
    torch.manual_seed(2)  # the checks draw their cases from a seed of their own
    assert (rejection('static mix without layer 0'), rejection('top-p short of p')) == first


def test_an_answer_that_raises_is_told_what_and_where_in_one_line(tmp_path):
    mine = tmp_path / 'mine.py'
    mine.write_text("def static_mix(R, memory):\n    return R @ memory\n")  # a list, not a tensor
    message = verdict(load(mine), 'static_mix', 'mine.py')
    assert message.startswith("it raised TypeError at line 2 of mine.py: "), message
    assert '\n' not in message


@pytest.mark.skipif(not ANSWERS.is_file(), reason=f"exercises/answers.py {NOT_IN_THIS_COPY}")
def test_student_file_has_each_exercise_with_the_answers_signature():
    answers, student = load(ANSWERS), load('exercises/student.py')
    for name in EXERCISES:
        assert inspect.signature(getattr(student, name)) == inspect.signature(
            getattr(answers, name)), name
