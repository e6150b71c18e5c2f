"""
Tests for docs/walkthrough.md: every Python block runs, in order, in one namespace, as a student
types them at the prompt from the repo root, echoing nothing; the page points at code by name,
names that exist; its figure is the README's; and its notebook, docs/walkthrough.ipynb, holds
the same cells with their outputs, and runs in a Jupyter kernel (where the notebook's packages
are installed).

    python -m pytest -q tests/test_walkthrough.py
"""
import builtins
import codeop
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import torch

import lime
from baselines import hyper_connections
from exercises import load
from lab.notebook import cells

ROOT = Path(__file__).resolve().parents[1]
WALKTHROUGH = ROOT / 'docs' / 'walkthrough.md'
NOTEBOOK = ROOT / 'docs' / 'walkthrough.ipynb'
NOTEBOOK_PACKAGES = ['nbformat', 'nbclient', 'ipykernel']
MISSING_PACKAGES = [name for name in NOTEBOOK_PACKAGES if importlib.util.find_spec(name) is None]
STUDENT_COMMAND = 'LIME_EXERCISES=exercises/student.py python -m pytest -q tests/test_exercises.py'


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
    monkeypatch.setattr(lime, 'mix_kernels', None)  # the plain mix, whatever another test set
    blocks = python_blocks()
    assert len(blocks) >= 10, "the walkthrough lost its Python blocks"
    echoed = []
    monkeypatch.setattr(sys, 'displayhook', lambda value: echoed.append(value))
    namespace = {'__name__': '__main__'}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a second thread costs more to wake than it saves
    try:
        with torch.random.fork_rng(devices=[]):  # the blocks seed torch: undo it after
            for line, code in blocks:
                for start, source in prompt_statements(line, code):
                    # Padded so that a traceback gives the line in docs/walkthrough.md.
                    exec(compile('\n' * (start - 1) + source, str(WALKTHROUGH), 'single'),
                         namespace)
                    noise = [value for value in echoed if value is not None]
                    assert not noise, (f"docs/walkthrough.md line {start} echoes "
                                       f"{str(noise[0])[:60]!r}: assign it, or print what it shows")
    finally:
        torch.set_num_threads(threads)
    assert 'torch.Size([2, 10, 101])' in capsys.readouterr().out


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


def mermaid(text):
    return re.findall(r'^```mermaid\n(.*?)^```', text, re.M | re.S)


def test_readme_and_walkthrough_draw_the_same_data_flow():
    readme = (ROOT / 'README.md').read_text()
    figure = mermaid(WALKTHROUGH.read_text())
    assert len(figure) == 1 and mermaid(readme) == figure
    # The figure names the code it draws, which must still be there.
    model = (ROOT / 'lime.py').read_text()
    for name in ('attn_norm', 'q_proj', 'kv_proj', 'memory.append', 'o_proj', 'KVCache'):
        assert name in figure[0] and name in model, name


def test_notebook_is_the_walkthrough_cell_for_cell_with_each_blocks_output():
    # lab/notebook.py writes it from the page; an edit to one alone fails here.
    notebook = json.loads(NOTEBOOK.read_text())
    found = [(cell['cell_type'], ''.join(cell['source'])) for cell in notebook['cells']]
    assert found == cells(WALKTHROUGH.read_text()), \
        "docs/walkthrough.ipynb differs from docs/walkthrough.md: python -m lab.notebook"
    for cell in notebook['cells']:
        if cell['cell_type'] == 'code':
            kinds = [output['output_type'] for output in cell['outputs']]
            assert 'error' not in kinds, ''.join(cell['source'])
            assert bool(kinds) == ('print(' in ''.join(cell['source'])), ''.join(cell['source'])
    answers = [source for kind, source in found if '<details><summary>Answer' in source]
    predictions = [source for kind, source in found if '**Predict.**' in source]
    assert len(answers) >= len(predictions) >= 10


@pytest.mark.skipif(bool(MISSING_PACKAGES), reason=f"the notebook's packages are not installed "
                    f"({', '.join(MISSING_PACKAGES)}; optional: pip install nbformat nbclient "
                    "ipykernel)")
def test_notebook_runs_top_to_bottom_in_a_jupyter_kernel_from_its_folder():
    import nbformat
    from nbclient import NotebookClient
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    stored = [cell.get('outputs') for cell in notebook.cells]
    # Jupyter starts beside the notebook: its first code cell finds the repo root from there.
    NotebookClient(notebook, timeout=600, kernel_name='python3',
                   resources={'metadata': {'path': str(NOTEBOOK.parent)}}).execute()
    for cell, before in zip(notebook.cells, stored):
        if cell.cell_type == 'code':
            assert bool(cell.outputs) == bool(before), cell.source
    printed = [''.join(output.get('text', '') for output in cell.outputs)
               for cell in notebook.cells if cell.cell_type == 'code']
    assert printed[1] == 'torch.Size([2, 10, 101])\n'  # the page's first block, after the setup
