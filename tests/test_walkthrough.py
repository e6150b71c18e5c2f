"""
docs/walkthrough.md: its blocks run in order as typed at the prompt, echoing nothing and printing
what the teacher's notebook holds; it names code that exists; its notebooks are its cells, the
teacher's with each block's outputs, which a Jupyter kernel gives again, the student's with none.
"""
import builtins
import codeop
import json
import re
import sys
from pathlib import Path

import pytest
import torch

import lime
from baselines import hyper_connections
from conftest import ROOT
from exercises import load
from lab.notebook import cells

PAGE = Path(ROOT, 'docs', 'walkthrough.md').read_text()
NOTEBOOKS = {'teacher': f'{ROOT}/docs/walkthrough.ipynb',
             'student': f'{ROOT}/docs/walkthrough_student.ipynb'}
NUMBER = re.compile(r'[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?')
# How a block states the tolerance of its printed numbers (none: they print exactly).
ROUNDING = re.compile(r'rounding may move the numbers? printed by up to (\d+(?:\.\d+)?(?:e-\d+)?)')


def same_output(stored, printed, code):
    """Whether printed is what the notebook stored: the same text, its numbers within the
    tolerance the block states."""
    tol = float(ROUNDING.search(code)[1]) if ROUNDING.search(code) else 0.0
    return NUMBER.split(stored) == NUMBER.split(printed) and all(
        abs(float(a) - float(b)) <= tol for a, b in zip(NUMBER.findall(stored),
                                                        NUMBER.findall(printed)))


def notebook_cells(edition):
    return json.loads(Path(NOTEBOOKS[edition]).read_text())['cells']


def stdout_of(cell):
    return ''.join(''.join(output['text']) for output in cell['outputs']
                   if output['output_type'] == 'stream' and output['name'] == 'stdout')


def draws(cell):
    return any(output['output_type'] == 'display_data' for output in cell['outputs'])


def prompt_statements(line, code):
    """(first line number, source) of each statement of the block at line, as the Python prompt
    runs it: once complete (codeop decides, as the prompt does), an indented one only after an
    empty line."""
    compiler, pending, start = codeop.CommandCompiler(), [], line
    for number, text in enumerate(code.splitlines() + [''], start=line):
        start = number if not pending else start
        pending.append(text)
        try:
            done = compiler('\n'.join(pending), 'docs/walkthrough.md', 'single')
        except SyntaxError as e:
            pytest.fail(f"docs/walkthrough.md line {number}, typed at the prompt: {e.msg} (end an "
                        "indented statement with an empty line)")
        if done is not None or not text.strip() and len(pending) == 1:
            if any(part.strip() and not part.lstrip().startswith('#') for part in pending):
                yield start, '\n'.join(pending)
            pending = []


def test_walkthrough_blocks_run_in_order_at_the_prompt_and_echo_nothing(monkeypatch, capsys):
    # The prompt echoes an expression statement's value (a tensor's zero_()), noise a student
    # need not read: a block that wants a value shown prints it.
    monkeypatch.chdir(ROOT)
    blocks = [(PAGE.count('\n', 0, m.start(1)) + 1, m[1])
              for m in re.finditer(r'^```python\n(.*?)^```', PAGE, re.M | re.S)]
    stored = [cell for cell in notebook_cells('teacher') if cell['cell_type'] == 'code'][1:]
    assert len(blocks) == len(stored) >= 10, "python -m lab.notebook"
    echoed = []
    monkeypatch.setattr(sys, 'displayhook', echoed.append)
    namespace = {'__name__': '__main__'}
    with torch.random.fork_rng(devices=[]):  # the blocks seed torch: undo it after
        for (line, code), cell in zip(blocks, stored):
            for start, source in prompt_statements(line, code):
                # Padded so that a traceback gives the line in docs/walkthrough.md.
                exec(compile('\n' * (start - 1) + source, 'docs/walkthrough.md', 'single'),
                     namespace)
                noise = [value for value in echoed if value is not None]
                assert not noise, f"line {start} echoes {str(noise[0])[:60]!r}: assign it"
            # A block that draws prints otherwise without matplotlib: the kernel's test has it.
            printed = capsys.readouterr().out
            assert draws(cell) or same_output(stdout_of(cell), printed, code), (
                f"docs/walkthrough.md line {line} prints {printed!r}, but the teacher's notebook "
                f"holds {stdout_of(cell)!r}: python -m lab.notebook")


def test_walkthrough_names_code_that_exists_by_name_not_line_number():
    # `Name` or `Name.attr` where Name is in lime.py, or is CamelCase, must resolve in lime.py,
    # the baseline or exercises/student.py (a student's copy has no answers), test names in
    # test_lime.py: a renamed class shows up here, not in a student's afternoon.
    homes = (lime, hyper_connections, load('exercises/student.py'), builtins)
    missing = []
    for name in sorted(set(re.findall(r'`([A-Za-z_]\w*(?:\.\w+)*)`', PAGE))):
        first, *rest = name.split('.')
        if not (hasattr(lime, first) or first[0].isupper() and not first.isupper()):
            continue  # a variable, a key or a constant, such as `memory` or `LIME_EXERCISES`
        obj = next((getattr(home, first) for home in homes if hasattr(home, first)), None)
        for attr in rest:
            obj = getattr(obj, attr, None)
        missing += [name] if obj is None else []
    spec = Path(ROOT, 'test_lime.py').read_text()
    missing += [name for name in re.findall(r'`(test_\w+)`', PAGE) if f'def {name}(' not in spec]
    assert not missing, f"docs/walkthrough.md names what the code lacks: {missing}"
    found = re.findall(r'\.py:\d+|\b[Ll]ines? \d+', PAGE)
    assert not found, f"line numbers go stale; name the class or function instead: {found}"


@pytest.mark.parametrize('edition', NOTEBOOKS)
def test_notebook_is_the_walkthroughs_cells_with_its_images_and_the_teachers_outputs(edition):
    found = notebook_cells(edition)
    assert [(c['cell_type'], ''.join(c['source'])) for c in found] == cells(PAGE, edition), \
        f"{NOTEBOOKS[edition]} is not docs/walkthrough.md's: python -m lab.notebook"
    for cell in found:
        linked = re.findall(r'\(attachment:([\w.-]+\.png)\)', ''.join(cell['source']))
        assert sorted(cell.get('attachments', {})) == linked, "python -m lab.notebook"
        if cell['cell_type'] == 'code' and edition == 'student':
            assert cell['outputs'] == [] and cell['execution_count'] is None
        elif cell['cell_type'] == 'code':
            assert 'error' not in [output['output_type'] for output in cell['outputs']]
            assert bool(cell['outputs']) == ('print(' in ''.join(cell['source']))
    assert edition == 'student' or sum(draws(c) for c in found if 'outputs' in c) == 1  # section 9


@pytest.mark.optional
def test_notebook_runs_top_to_bottom_in_a_jupyter_kernel_and_gives_its_outputs_again():
    for name in ('nbformat', 'nbclient', 'ipykernel', 'matplotlib'):
        pytest.importorskip(name, reason=f"optional, for the notebook: pip install {name}")
    import nbclient
    import nbformat
    notebook = nbformat.read(NOTEBOOKS['teacher'], as_version=4)
    stored = [cell.get('outputs') for cell in notebook.cells]
    nbclient.NotebookClient(notebook, timeout=600, kernel_name='python3', coalesce_streams=True,
                            resources={'metadata': {'path': f'{ROOT}/docs'}}).execute()
    for cell, before in zip(notebook.cells, stored):
        if cell.cell_type == 'code':  # the text within the block's tolerance; images by kind
            assert [o['output_type'] for o in cell.outputs] == [o['output_type'] for o in before]
            text = stdout_of({'outputs': before})
            assert same_output(text, stdout_of(cell), cell.source), (cell.source, text)
