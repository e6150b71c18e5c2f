"""
notebook.py: docs/walkthrough.md's notebooks, its text and Python blocks cell by cell, its images
attached: the teacher's, run in a Jupyter kernel, with what each block printed and drew; the
student's, each block's results in the folded answer below it. After an edit of the page, run
`python -m lab.notebook` from the repo root (pip install nbformat nbclient ipykernel matplotlib).
"""
import base64
import re
from pathlib import Path

ANSWER = '<details><summary>Answer</summary>\n\n'  # how each answer's fold opens
RESULTS = ("What the block printed here, and what it asserts (run that too):\n\n"
           "```python\n{}\n```\n\n")
SETUP = """import os

if not os.path.exists('lime.py') and os.path.exists('../lime.py'):
    os.chdir('..')  # Jupyter starts beside this notebook, in docs/; lime.py is in the repo root"""


def page_cells(text, edition='teacher'):
    """[(kind, source)]: the page's text between its Python blocks, and the blocks, in order; in
    the student's edition each block's results open the answer after it."""
    parts = re.split(r'^```python\n(.*?)^```\n', text, flags=re.M | re.S)  # text, code, text, ...
    found = [['code' if i % 2 else 'markdown', part.strip('\n')] for i, part in enumerate(parts)]
    for i in range(1, len(found) - 1, 2) if edition == 'student' else []:  # block, text after
        found[i][1], results = split_results(found[i][1])
        if results:  # tests/test_handout.py checks that an answer follows to hold them
            shown = RESULTS.format('\n'.join(results))
            found[i + 1][1] = found[i + 1][1].replace(ANSWER, ANSWER + shown, 1)
    return [(kind, source) for kind, source in found if source]


def split_results(code):
    """(the code without its results, the results): what a print shows, in the comment on its line
    or in the comment lines after it (the print given with them), and each top-level assert."""
    kept, results = [], []
    for line in code.split('\n'):
        if line.startswith('assert '):
            results.append(line)
        elif line.lstrip().startswith('#') and kept and kept[-1].lstrip().startswith('print('):
            results += [kept[-1].strip()] * (kept[-1].strip() not in results) + [line.strip()]
        elif line.lstrip().startswith('print(') and '  # ' in line:
            results.append(line.strip())
            kept.append(line[:line.index('  # ')])
        else:
            kept.append(line)
    return '\n'.join(kept), results


def cells(text, edition='teacher'):
    """The edition's notebook cells: the page's, the setup after its title, its images attached."""
    found = [(kind, re.sub(r'\]\(\.\./assets/', '](attachment:', source))
             for kind, source in page_cells(text, edition)]
    return found[:1] + [('code', SETUP)] + found[1:]


def student_page(text):
    """The page's student edition in markdown, for a class's copy (python -m lab.handout)."""
    return '\n\n'.join(f"```python\n{source}\n```" if kind == 'code' else source
                       for kind, source in page_cells(text, 'student')) + '\n'


if __name__ == '__main__':
    from configurator import configure
    configure(globals(), {})  # no keys: --help prints the docstring, anything else one error line
    import nbformat  # for maintainers only: the rest of the repo runs without them
    from nbclient import NotebookClient
    text = Path('docs/walkthrough.md').read_text()
    for edition, path in (('teacher', 'docs/walkthrough.ipynb'),
                          ('student', 'docs/walkthrough_student.ipynb')):
        kernel = {'name': 'python3', 'display_name': 'Python 3'}
        nb = nbformat.v4.new_notebook(metadata={'kernelspec': kernel})
        for i, (kind, source) in enumerate(cells(text, edition)):
            nb.cells.append(getattr(nbformat.v4, f'new_{kind}_cell')(source, id=f'cell-{i}'))
            for name in re.findall(r'\(attachment:([\w.-]+\.png)\)', source):
                image = base64.b64encode(Path(f'assets/{name}').read_bytes()).decode()
                nb.cells[-1].setdefault('attachments', {})[name] = {'image/png': image}
        if edition == 'teacher':  # run beside the notebook, where Jupyter starts
            NotebookClient(nb, timeout=600, kernel_name='python3', coalesce_streams=True,
                           record_timing=False, resources={'metadata': {'path': 'docs'}}).execute()
        nbformat.write(nb, path)
        print(f"wrote {path}: {len(nb.cells)} cells")
