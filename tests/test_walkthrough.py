"""
Tests for docs/walkthrough.md: every Python block runs, in order, in one namespace, as a student
types them from the repo root; and the page points at code by name, names that exist.

    python -m pytest -q tests/test_walkthrough.py
"""
import builtins
import codeop
import re
from pathlib import Path

import pytest
import torch

import lime
from baselines import hyper_connections

ROOT = Path(__file__).resolve().parents[1]
WALKTHROUGH = ROOT / 'docs' / 'walkthrough.md'
STUDENT_COMMAND = 'LIME_EXERCISES=exercises/student.py python -m pytest -q tests/test_exercises.py'


def python_blocks():
    """(first line number, code) of each ```python block, in order."""
    text = WALKTHROUGH.read_text()
    return [(text.count('\n', 0, m.start(1)) + 1, m.group(1))
            for m in re.finditer(r'^```python\n(.*?)^```', text, re.M | re.S)]


def test_walkthrough_python_blocks_run_in_order_in_one_namespace(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(lime, 'mix_kernels', None)  # the plain mix, whatever another test set
    blocks = python_blocks()
    assert len(blocks) >= 10, "the walkthrough lost its Python blocks"
    namespace = {'__name__': '__main__'}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a second thread costs more to wake than it saves
    try:
        with torch.random.fork_rng(devices=[]):  # the blocks seed torch: undo it after
            for line, code in blocks:
                # Padded so that a traceback gives the line in docs/walkthrough.md.
                exec(compile('\n' * (line - 1) + code, str(WALKTHROUGH), 'exec'), namespace)
    finally:
        torch.set_num_threads(threads)
    assert 'torch.Size([2, 10, 101])' in capsys.readouterr().out


def test_walkthrough_blocks_can_be_pasted_at_the_python_prompt():
    # The prompt runs a statement once it is complete, and an indented one only after an empty
    # line: a loop followed at once by an unindented line is a SyntaxError there (before Python
    # 3.13), though fine in a file. codeop decides completeness as the prompt does.
    compiler = codeop.CommandCompiler()
    for line, code in python_blocks():
        pending = []
        for number, text in enumerate(code.splitlines() + [''], start=line):
            pending.append(text)
            try:
                done = compiler('\n'.join(pending), str(WALKTHROUGH), 'single')
            except SyntaxError as e:
                pytest.fail(f"docs/walkthrough.md line {number}, typed at the prompt: {e.msg} "
                            "(end an indented statement with an empty line)")
            if done is not None or not text.strip() and len(pending) == 1:
                pending = []
        assert not pending, f"docs/walkthrough.md line {line}: a block ends mid-statement"


def test_walkthrough_names_code_that_exists():
    # `Name` or `Name.attr` where Name is in lime.py, or is a CamelCase name, must resolve (in
    # lime.py, or the baseline the page points to): a renamed class or method shows up here, not
    # in a student's afternoon.
    text = WALKTHROUGH.read_text()
    missing = []
    for name in sorted(set(re.findall(r'`([A-Za-z_]\w*(?:\.\w+)*)`', text))):
        first, *rest = name.split('.')
        if not (hasattr(lime, first) or first[0].isupper() and not first.isupper()):
            continue  # a variable, a key or a constant, such as `memory` or `LIME_EXERCISES`
        obj = getattr(lime, first, getattr(hyper_connections, first, getattr(builtins, first, None)))
        for attr in rest:
            obj = getattr(obj, attr, None)
        if obj is None:
            missing.append(name)
    assert not missing, f"docs/walkthrough.md names what the code lacks: {missing}"


def test_walkthrough_points_at_code_by_name_not_line_number():
    text = WALKTHROUGH.read_text()
    found = re.findall(r'\.py:\d+|\b[Ll]ines? \d+', text)
    assert not found, f"line numbers go stale; name the class or function instead: {found}"


def test_walkthrough_names_test_lime_tests_that_exist():
    names = set(re.findall(r'`(test_\w+)`', WALKTHROUGH.read_text()))
    spec = (ROOT / 'test_lime.py').read_text()
    missing = [name for name in sorted(names) if f'def {name}(' not in spec]
    assert names and not missing, f"docs/walkthrough.md names tests test_lime.py lacks: {missing}"


def test_readme_gives_the_students_path():
    readme = (ROOT / 'README.md').read_text()
    assert 'docs/walkthrough.md' in readme and STUDENT_COMMAND in readme
    assert STUDENT_COMMAND in WALKTHROUGH.read_text()
