"""
notebook.py: writes the walkthrough's two notebooks from docs/walkthrough.md, its text as markdown
cells (a cell per section) and its Python blocks as code cells:

- the teacher's, docs/walkthrough.ipynb: run top to bottom in a Jupyter kernel, it holds what
  each block printed and drew;
- the student's, docs/walkthrough_student.ipynb: no outputs, and each block's results (the
  comments that give what a print shows, and the asserts) moved into the folded answer below
  it, so that every "predict, then run" question can be answered before the run.

Both hold the page's images (assets/*.png) as attachments, so that they show wherever a notebook is
opened. The page is the source: edit it, then write the notebooks again; tests/test_walkthrough.py
fails while they differ. From the repo root, with the notebook packages and matplotlib (optional
for the rest of the repo; section 9 draws heatmaps with it):

    pip install nbformat nbclient ipykernel matplotlib
    python -m lab.notebook
"""
import ast
import base64
import io
import os
import re
import tokenize

from configurator import configure, fail, read_text

# -----------------------------------------------------------------------------
page = 'docs/walkthrough.md'  # the source
notebook = 'docs/walkthrough.ipynb'  # the teacher's edition, with outputs
student_notebook = 'docs/walkthrough_student.ipynb'  # the student's, with none
timeout = 600  # seconds a cell may run
# -----------------------------------------------------------------------------
ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'assets')
IMAGE = re.compile(r'!\[([^\]]*)\]\(\.\./assets/([\w.-]+\.png)\)')  # the page's images
ANSWER = '<details><summary>Answer</summary>\n\n'  # how each answer's fold opens

# The notebooks' own cells, after the page's title and introduction.
NOTES = {
    'teacher': """*This notebook is made from [walkthrough.md](walkthrough.md) by
`python -m lab.notebook`, with what each block printed and drew on a 2-core x86-64 VM (torch
2.13.0, CPU): edit the page, not the notebook. The answers are folded: click "Answer" once you
have run the block. Section 9 draws heatmaps with matplotlib (`pip install matplotlib`). For a
class, hand out the student's edition, [walkthrough_student.ipynb](walkthrough_student.ipynb),
where what a block prints is in its answer.*""",
    'student': """*This is the student's edition of [walkthrough.md](walkthrough.md), made by
`python -m lab.notebook`. It stores no outputs: what each block printed on a 2-core x86-64 VM
(torch 2.13.0, CPU), and the asserts that check it, are in the folded answer below the block.
Write down your prediction, run the block, then click "Answer" to compare. Section 9 draws
heatmaps with matplotlib (`pip install matplotlib`).*""",
}
PAGE_NOTE = """*The student's edition of this page, written by `python -m lab.handout`: what each
block printed on a 2-core x86-64 VM (torch 2.13.0, CPU), and the asserts that check it, are in the
folded answer below the block. Write down your prediction, run the block, then open "Answer" to
compare.*"""
SETUP = """import os
import sys

if not os.path.exists('lime.py') and os.path.exists('../lime.py'):
    os.chdir('..')  # Jupyter starts beside this notebook, in docs/; the code is in the repo root
if not os.path.exists('lime.py'):
    raise FileNotFoundError("lime.py: open this notebook in a clone of the repo (in Colab: "
                            "!git clone the repo, then %cd into it)")
sys.path.insert(0, os.getcwd())  # import lime from the repo root"""


def page_cells(text, attach=True):
    """[(kind, source)]: the page's markdown ('markdown', a cell per section) and its Python
    blocks ('code'), in order; images of assets/ linked as the notebook's attachments (attach),
    or as the page links them."""
    found = []
    parts = re.split(r'^```python\n(.*?)^```\n', text, flags=re.M | re.S)  # text, code, text, ...
    for i, part in enumerate(parts):
        if i % 2:
            found.append(('code', part.rstrip('\n')))
            continue
        for section in re.split(r'^(?=## )', part, flags=re.M):  # before each section heading
            if section.strip():
                section = section.strip('\n')
                found.append(('markdown', IMAGE.sub(r'![\1](attachment:\2)', section)
                              if attach else section))
    return found


def cells(text, edition='teacher'):
    """[(kind, source)] of the edition's notebook: the page's cells, with its NOTE and SETUP after
    the title and introduction; in the student's, each block's results moved into its answer."""
    found = page_cells(text)
    if edition == 'student':
        found = results_in_answers(found)
    return found[:1] + [('markdown', NOTES[edition]), ('code', SETUP)] + found[1:]


def student_page(text):
    """The page's student edition, in markdown (python -m lab.handout puts it in a class's copy):
    as the student's notebook has it, each block's results moved into its answer's fold."""
    found = results_in_answers(page_cells(text, attach=False))
    found = found[:1] + [('markdown', PAGE_NOTE)] + found[1:]
    return '\n\n'.join(source if kind == 'markdown' else f"```python\n{source}\n```"
                       for kind, source in found) + '\n'


def results_in_answers(found):
    """The cells with each code cell's results (split_results) moved to the top of the answer
    that opens the markdown cell after it."""
    moved = list(found)
    for i, (kind, source) in enumerate(found):
        if kind != 'code':
            continue
        code, results = split_results(source)
        moved[i] = ('code', code)
        if not results:
            continue
        after = found[i + 1][1] if i + 1 < len(found) else ''
        if not after.startswith(ANSWER):
            fail(f"a block of {page} states its results, but no answer fold follows it: "
                 f"{results[0].strip()}")
        shown = ("What the block printed here, and what it asserts (run that too):\n\n"
                 "```python\n" + '\n'.join(results) + "\n```\n\n")
        moved[i + 1] = ('markdown', ANSWER + shown + after[len(ANSWER):])
    return moved


def split_results(code):
    """(the code without its results, the result lines). A block's results: the comment on a
    print's last line and the comment lines right after the print (what it shows), and each
    top-level assert (what the block shows). The print stays in the code, without its comment;
    the result lines give it with its comments, and the asserts, unindented."""
    lines = code.split('\n')
    tree = ast.parse(code)
    comments = {token.start[0]: token.start[1] for token in
                tokenize.generate_tokens(io.StringIO(code).readline)
                if token.type == tokenize.COMMENT}  # line: column of its comment
    drop, cut, shown = set(), {}, set()  # lines moved, comments cut off, prints shown with them
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert) and node in tree.body:
            drop |= set(range(node.lineno, node.end_lineno + 1))
        elif is_print(node):
            after = node.end_lineno + 1
            while after <= len(lines) and lines[after - 1].strip().startswith('#'):
                drop.add(after)
                after += 1
            if node.end_lineno in comments:
                cut[node.end_lineno] = comments[node.end_lineno]
            if node.end_lineno in comments or after > node.end_lineno + 1:
                shown |= set(range(node.lineno, node.end_lineno + 1))
    results = [line.strip() for number, line in enumerate(lines, 1)
               if number in drop or number in shown]
    kept = [line[:cut[n]].rstrip() if n in cut else line
            for n, line in enumerate(lines, 1) if n not in drop]
    return '\n'.join(kept).strip('\n'), results


def is_print(node):
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name) and node.value.func.id == 'print')


def attachments(source):
    """{name: {'image/png': base64}} for each attachment a markdown cell links to."""
    found = {}
    for name in re.findall(r'\(attachment:([\w.-]+\.png)\)', source):
        with open(os.path.join(ASSETS, name), 'rb') as f:
            found[name] = {'image/png': base64.b64encode(f.read()).decode()}
    return found


def build(nbformat, text, edition):
    nb = nbformat.v4.new_notebook()
    for i, (kind, source) in enumerate(cells(text, edition)):
        if kind == 'code':
            cell = nbformat.v4.new_code_cell(source, id=f'cell-{i}')  # ids by place: stable
        else:
            cell = nbformat.v4.new_markdown_cell(source, id=f'cell-{i}')
            images = attachments(source)
            if images:
                cell.attachments = images
        nb.cells.append(cell)
    # The kernel's version and the like would change the file on every machine: only the kind.
    nb.metadata = {'kernelspec': {'name': 'python3', 'display_name': 'Python 3',
                                  'language': 'python'}, 'language_info': {'name': 'python'}}
    return nb


def main():
    config, _, _ = configure(globals(), {
        'path': ['page', 'notebook', 'student_notebook'], 'positive': ['timeout']})
    try:
        import matplotlib  # noqa: F401  section 9's heatmaps, drawn into the teacher's edition
        import nbformat
        from nbclient import NotebookClient
        from nbclient.exceptions import CellExecutionError
    except ImportError as e:
        fail(f"writing the notebooks needs the notebook packages and matplotlib ({e.name} is "
             "missing): pip install nbformat nbclient ipykernel matplotlib")
    text = read_text(config['page'], 'the walkthrough')
    teacher, student = build(nbformat, text, 'teacher'), build(nbformat, text, 'student')
    folder = os.path.dirname(os.path.abspath(config['notebook']))  # where Jupyter would start
    client = NotebookClient(teacher, timeout=config['timeout'], kernel_name='python3',
                            resources={'metadata': {'path': folder}}, record_timing=False,
                            coalesce_streams=True)  # one output per stream, however flushed
    try:
        client.execute()
    except CellExecutionError as e:
        fail(f"a cell of {config['page']} failed in the kernel: {str(e).strip().splitlines()[-1]}")
    for nb, path in ((teacher, config['notebook']), (student, config['student_notebook'])):
        nbformat.validate(nb)
        nbformat.write(nb, path)
        print(f"wrote {path}: {len(nb.cells)} cells, from {config['page']}")


if __name__ == '__main__':
    main()
