"""
Tests for docs/walkthrough.md: every Python block runs, in order, in one namespace, as a student
types them at the prompt from the repo root, echoing nothing and printing what the notebook holds;
the page points at code by name, names that exist; its notebooks hold its cells: the teacher's, docs/walkthrough.ipynb,
with their outputs, which a run in a Jupyter kernel gives again (where the notebook's packages are
installed); the student's, docs/walkthrough_student.ipynb, with no output, and no result of a
block in sight before its answer's fold.

    python -m pytest -q tests/test_walkthrough.py
"""
import base64
import builtins
import codeop
import importlib.util
import json
import re
import struct
import sys
from pathlib import Path

import pytest
import torch

import lime
from baselines import hyper_connections
from exercises import load
from lab.notebook import cells, split_results

ROOT = Path(__file__).resolve().parents[1]
WALKTHROUGH = ROOT / 'docs' / 'walkthrough.md'
NOTEBOOK = ROOT / 'docs' / 'walkthrough.ipynb'
STUDENT_NOTEBOOK = ROOT / 'docs' / 'walkthrough_student.ipynb'
NOTEBOOK_PACKAGES = ['nbformat', 'nbclient', 'ipykernel', 'matplotlib']
MISSING_PACKAGES = [name for name in NOTEBOOK_PACKAGES if importlib.util.find_spec(name) is None]
STUDENT_COMMAND = 'LIME_EXERCISES=exercises/student.py python -m pytest -q tests/test_exercises.py'


NUMBER = re.compile(r'[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?')
# How a block states the tolerance of its printed numbers (none: they print exactly).
ROUNDING = re.compile(r'rounding may move the numbers? printed by up to (\d+(?:\.\d+)?(?:e-\d+)?)')


def tolerance(code):
    found = ROUNDING.search(code)
    return float(found[1]) if found else 0.0


def same_output(stored, printed, tol):
    """Whether printed is what the notebook stored: the same text, its numbers within tol."""
    if stored == printed:
        return True
    if NUMBER.split(stored) != NUMBER.split(printed):  # the words, with the numbers taken out
        return False
    return all(abs(float(a) - float(b)) <= tol
               for a, b in zip(NUMBER.findall(stored), NUMBER.findall(printed)))


def joined(text):
    return ''.join(text) if isinstance(text, list) else text  # .ipynb splits text into lines


def stdout_of(cell):
    return ''.join(joined(output['text']) for output in cell['outputs']
                   if output['output_type'] == 'stream' and output['name'] == 'stdout')


def draws(cell):
    return any(output['output_type'] == 'display_data' for output in cell['outputs'])


def stored_blocks():
    """The teacher's notebook's code cells of the page's blocks (after its own setup cell)."""
    notebook = json.loads(NOTEBOOK.read_text())
    return [cell for cell in notebook['cells'] if cell['cell_type'] == 'code'][1:]


def python_blocks():
    """(first line number, code) of each ```python block, in order."""
    text = WALKTHROUGH.read_text()
    return [(text.count('\n', 0, m.start(1)) + 1, m.group(1))
            for m in re.finditer(r'^```python\n(.*?)^```', text, re.M | re.S)]


def prompt_statements(line, code):
    """(first line number, source) of each statement of the block at line, as the Python prompt
    runs it: once it is complete, an indented one only after an empty line. codeop decides
    completeness as the prompt does; a loop followed at once by an unindented line is a
    SyntaxError there (before Python 3.13), though fine in a file."""
    compiler = codeop.CommandCompiler()
    pending, start = [], line
    for number, text in enumerate(code.splitlines() + [''], start=line):
        if not pending:
            start = number
        pending.append(text)
        try:
            done = compiler('\n'.join(pending), str(WALKTHROUGH), 'single')
        except SyntaxError as e:
            pytest.fail(f"docs/walkthrough.md line {number}, typed at the prompt: {e.msg} "
                        "(end an indented statement with an empty line)")
        if done is not None or not text.strip() and len(pending) == 1:
            if any(part.strip() and not part.lstrip().startswith('#') for part in pending):
                yield start, '\n'.join(pending)
            pending = []
    assert not pending, f"docs/walkthrough.md line {line}: a block ends mid-statement"


def test_walkthrough_blocks_run_in_order_at_the_prompt_and_echo_nothing(monkeypatch, capsys):
    # Statement by statement in one namespace, as the prompt runs them: the prompt echoes the
    # value of an expression statement (a tensor's zero_(), a Parameter), noise a student need
    # not read; a block that wants a value shown prints it.
    monkeypatch.chdir(ROOT)
    blocks, stored = python_blocks(), stored_blocks()
    assert len(blocks) >= 10, "the walkthrough lost its Python blocks"
    assert len(stored) == len(blocks), "docs/walkthrough.ipynb is not the page's: python -m " \
                                       "lab.notebook"
    echoed = []
    monkeypatch.setattr(sys, 'displayhook', lambda value: echoed.append(value))
    namespace = {'__name__': '__main__'}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a second thread costs more to wake than it saves
    try:
        with torch.random.fork_rng(devices=[]):  # the blocks seed torch: undo it after
            for (line, code), cell in zip(blocks, stored):
                for start, source in prompt_statements(line, code):
                    # Padded so that a traceback gives the line in docs/walkthrough.md.
                    exec(compile('\n' * (start - 1) + source, str(WALKTHROUGH), 'single'),
                         namespace)
                    noise = [value for value in echoed if value is not None]
                    assert not noise, (f"docs/walkthrough.md line {start} echoes "
                                       f"{str(noise[0])[:60]!r}: assign it, or print what it shows")
                # What the notebook holds for the block, which a hand-edit would change. A block
                # that draws prints what it does without matplotlib: the kernel's test has it.
                printed = capsys.readouterr().out
                assert draws(cell) or same_output(stdout_of(cell), printed, tolerance(code)), (
                    f"docs/walkthrough.md line {line} prints {printed!r}, but "
                    f"docs/walkthrough.ipynb holds {stdout_of(cell)!r}: python -m lab.notebook")
    finally:
        torch.set_num_threads(threads)


def test_a_hand_edited_output_is_not_the_same_output():
    first = stdout_of(stored_blocks()[0])
    assert first == 'torch.Size([2, 10, 101])\n'
    assert not same_output(first.replace('101', '999'), first, 0.0)
    assert not same_output(first.replace('Size', 'size'), first, 0.5)
    # Where a block states a tolerance, numbers move within it, and no further.
    assert same_output('loss 0.412 | 0.31\n', 'loss 0.405 | 0.32\n', 0.02)
    assert not same_output('loss 0.412 | 0.31\n', 'loss 0.512 | 0.31\n', 0.02)


def test_walkthrough_names_code_that_exists():
    # `Name` or `Name.attr` where Name is in lime.py, or is a CamelCase name, must resolve (in
    # lime.py, the baseline or the exercises the page points to): a renamed class or method shows
    # up here, not in a student's afternoon. (student.py, not answers.py: a student's copy, from
    # python -m lab.handout, has no answers.)
    text = WALKTHROUGH.read_text()
    exercises = load('exercises/student.py')
    missing = []
    for name in sorted(set(re.findall(r'`([A-Za-z_]\w*(?:\.\w+)*)`', text))):
        first, *rest = name.split('.')
        if not (hasattr(lime, first) or first[0].isupper() and not first.isupper()):
            continue  # a variable, a key or a constant, such as `memory` or `LIME_EXERCISES`
        homes = (lime, hyper_connections, exercises, builtins)  # exercises: exercise 6's router
        obj = next((getattr(home, first) for home in homes if hasattr(home, first)), None)
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


def check_attachments(notebook):
    """Each markdown cell holds the assets its text links to, as they are now."""
    for cell in notebook['cells']:
        linked = re.findall(r'\(attachment:([\w.-]+\.png)\)', joined(cell['source']))
        held = cell.get('attachments', {})
        assert sorted(held) == sorted(linked), joined(cell['source'])[:80]
        for name in linked:
            image = base64.b64encode((ROOT / 'assets' / name).read_bytes()).decode()
            assert joined(held[name]['image/png']) == image, \
                f"{name} changed since the notebook was written: python -m lab.notebook"


def test_notebook_is_the_walkthrough_cell_for_cell_with_each_blocks_output():
    # lab/notebook.py writes it from the page; an edit to one alone fails here.
    notebook = json.loads(NOTEBOOK.read_text())
    found = [(cell['cell_type'], joined(cell['source'])) for cell in notebook['cells']]
    assert found == cells(WALKTHROUGH.read_text()), \
        "docs/walkthrough.ipynb differs from docs/walkthrough.md: python -m lab.notebook"
    check_attachments(notebook)
    for cell in notebook['cells']:
        if cell['cell_type'] == 'code':
            kinds = [output['output_type'] for output in cell['outputs']]
            assert 'error' not in kinds, joined(cell['source'])
            assert bool(kinds) == ('print(' in joined(cell['source'])), joined(cell['source'])
    assert sum(draws(cell) for cell in stored_blocks()) == 1  # section 9's heatmaps
    answers = [source for kind, source in found if '<details><summary>Answer' in source]
    predictions = [source for kind, source in found if '**Predict.**' in source]
    assert len(answers) >= len(predictions) >= 10


def test_student_notebook_is_the_walkthrough_with_no_outputs():
    notebook = json.loads(STUDENT_NOTEBOOK.read_text())
    found = [(cell['cell_type'], joined(cell['source'])) for cell in notebook['cells']]
    assert found == cells(WALKTHROUGH.read_text(), 'student'), \
        "docs/walkthrough_student.ipynb differs from docs/walkthrough.md: python -m lab.notebook"
    check_attachments(notebook)
    for cell in notebook['cells']:
        if cell['cell_type'] == 'code':
            assert cell['outputs'] == [] and cell['execution_count'] is None


def test_student_notebook_shows_no_blocks_result_before_its_answers_fold():
    # What a student sees before opening an answer: the question above a block (the markdown
    # since the block before it, folds closed) and the block. None of it may hold a line the
    # block printed, a comment stating what a print shows, or an assert; the answer's fold must.
    student = json.loads(STUDENT_NOTEBOOK.read_text())['cells']
    printed = [stdout_of(cell) for cell in stored_blocks()]
    blocks = [code for _, code in python_blocks()]
    code_at = [i for i, cell in enumerate(student) if cell['cell_type'] == 'code'][1:]
    for n, (i, code, output) in enumerate(zip(code_at, blocks, printed)):
        before = code_at[n - 1] + 1 if n else 0
        question = ''.join(joined(cell['source']) for cell in student[before:i])
        seen = re.sub(r'<details>.*?</details>', '', question, flags=re.S)
        seen += joined(student[i]['source'])
        for line in output.splitlines():
            assert line.strip() not in seen, f"block {n + 1} shows what it prints: {line!r}"
        assert split_results(joined(student[i]['source']))[1] == [], joined(student[i]['source'])
        _, results = split_results(code)
        if results:
            answer = joined(student[i + 1]['source'])
            fold = answer[:answer.find('</details>')]
            assert fold.startswith('<details><summary>Answer</summary>'), f"block {n + 1}"
            assert all(result in fold for result in results), f"block {n + 1}'s results"


def png_size(image):
    """(width, height) of a base64 PNG, from its header."""
    return struct.unpack('>II', base64.b64decode(joined(image)[:32])[16:24])


def same_outputs(stored, rerun, tol):
    """Whether a code cell's outputs are the stored ones: text within the block's tolerance,
    images of the same kind and size (their pixels depend on matplotlib's version and fonts)."""
    if [o['output_type'] for o in stored] != [o['output_type'] for o in rerun]:
        return False
    for before, now in zip(stored, rerun):
        if before['output_type'] == 'stream':
            if not same_output(joined(before['text']), joined(now['text']), tol):
                return False
        elif sorted(before['data']) != sorted(now['data']):
            return False
        elif 'image/png' in before['data'] and \
                png_size(before['data']['image/png']) != png_size(now['data']['image/png']):
            return False
    return True


@pytest.mark.optional
@pytest.mark.skipif(bool(MISSING_PACKAGES), reason=f"the notebook's packages are not installed "
                    f"({', '.join(MISSING_PACKAGES)}; optional: pip install nbformat nbclient "
                    "ipykernel matplotlib)")
def test_notebook_runs_top_to_bottom_in_a_jupyter_kernel_and_gives_its_outputs_again(monkeypatch):
    import nbformat
    from nbclient import NotebookClient
    monkeypatch.setenv('OMP_NUM_THREADS', '1')  # the kernel's: tiny tensors, and a busy CI host
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    stored = [cell.get('outputs') for cell in notebook.cells]
    # Jupyter starts beside the notebook: its first code cell finds the repo root from there.
    NotebookClient(notebook, timeout=600, kernel_name='python3', coalesce_streams=True,
                   resources={'metadata': {'path': str(NOTEBOOK.parent)}}).execute()
    for cell, before in zip(notebook.cells, stored):
        if cell.cell_type == 'code':
            assert same_outputs(before, cell.outputs, tolerance(cell.source)), (
                f"a block's outputs differ from those stored in docs/walkthrough.ipynb:\n"
                f"{cell.source[:200]}\nstored: {shown(before)}\nnow: {shown(cell.outputs)}")


def shown(outputs):
    """Outputs in a line: their text, and an image by its size."""
    return [joined(output['text']) if output['output_type'] == 'stream' else
            png_size(output['data']['image/png']) if 'image/png' in output.get('data', {}) else
            output['output_type'] for output in outputs]
