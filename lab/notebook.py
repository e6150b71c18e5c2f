"""
notebook.py: writes docs/walkthrough.ipynb from docs/walkthrough.md: the page's text as markdown
cells (a cell per section), its Python blocks as code cells, run top to bottom in a Jupyter kernel
so that the notebook holds what each block prints. The page is the source: edit it, then write the
notebook again; tests/test_walkthrough.py fails while the two differ. From the repo root, with the
notebook packages (optional: a Jupyter kernel and what runs one):

    pip install nbformat nbclient ipykernel
    python -m lab.notebook
"""
import os
import re

from configurator import configure, fail, read_text

# -----------------------------------------------------------------------------
page = 'docs/walkthrough.md'  # the source
notebook = 'docs/walkthrough.ipynb'  # what it writes
timeout = 600  # seconds a cell may run
# -----------------------------------------------------------------------------

# The notebook's own cells, after the page's title and introduction.
NOTE = """*This notebook is made from [walkthrough.md](walkthrough.md) by `python -m lab.notebook`,
with what each block printed on a 2-core x86-64 VM (torch 2.13.0, CPU): edit the page, not the
notebook. The figure below is a Mermaid diagram: JupyterLab 4.1 and Notebook 7.1 or newer draw it;
GitHub's notebook view and Colab show its source, and GitHub draws it in walkthrough.md.
The answers are folded: click "Answer" once you have run the block.*"""
SETUP = """import os
import sys

if not os.path.exists('lime.py') and os.path.exists('../lime.py'):
    os.chdir('..')  # Jupyter starts beside this notebook, in docs/; the code is in the repo root
if not os.path.exists('lime.py'):
    raise FileNotFoundError("lime.py: open this notebook in a clone of the repo (in Colab: "
                            "!git clone the repo, then %cd into it)")
sys.path.insert(0, os.getcwd())  # import lime from the repo root"""


def cells(text):
    """[(kind, source)]: the page's markdown ('markdown', a cell per section) and its Python
    blocks ('code'), in order, with NOTE and SETUP after the title and introduction."""
    found = []
    parts = re.split(r'^```python\n(.*?)^```\n', text, flags=re.M | re.S)  # text, code, text, ...
    for i, part in enumerate(parts):
        if i % 2:
            found.append(('code', part.rstrip('\n')))
            continue
        for section in re.split(r'^(?=## )', part, flags=re.M):  # before each section heading
            if section.strip():
                found.append(('markdown', section.strip('\n')))
    return found[:1] + [('markdown', NOTE), ('code', SETUP)] + found[1:]


def main():
    config, _, _ = configure(globals(), {'path': ['page', 'notebook'], 'positive': ['timeout']})
    try:
        import nbformat
        from nbclient import NotebookClient
        from nbclient.exceptions import CellExecutionError
    except ImportError as e:
        fail(f"writing the notebook needs the notebook packages ({e.name} is missing): pip install "
             "nbformat nbclient ipykernel")
    nb = nbformat.v4.new_notebook()
    for i, (kind, source) in enumerate(cells(read_text(config['page'], 'the walkthrough'))):
        make = nbformat.v4.new_code_cell if kind == 'code' else nbformat.v4.new_markdown_cell
        nb.cells.append(make(source, id=f'cell-{i}'))  # ids by place: a rewrite changes none
    folder = os.path.dirname(os.path.abspath(config['notebook']))  # where Jupyter would start
    client = NotebookClient(nb, timeout=config['timeout'], kernel_name='python3',
                            resources={'metadata': {'path': folder}}, record_timing=False,
                            coalesce_streams=True)  # one output per stream, however flushed
    try:
        client.execute()
    except CellExecutionError as e:
        fail(f"a cell of {config['page']} failed in the kernel: {str(e).strip().splitlines()[-1]}")
    # The kernel's version and the like would change the file on every machine: only the kind.
    nb.metadata = {'kernelspec': {'name': 'python3', 'display_name': 'Python 3',
                                  'language': 'python'}, 'language_info': {'name': 'python'}}
    nbformat.validate(nb)
    nbformat.write(nb, config['notebook'])
    print(f"wrote {config['notebook']}: {len(nb.cells)} cells, from {config['page']}")


if __name__ == '__main__':
    main()
