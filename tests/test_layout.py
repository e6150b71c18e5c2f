"""
The reading path's limits, which hold for the project from now on: the top level is the card
(lime.py, train.py, sample.py, prepare.py, test_lime.py) with the modules that serve it
(configurator.py reads the settings, bookkeeping.py keeps a run safe: files written whole, one
run per out_dir, stop signals that save); what a
default run does not use lives in folders and is imported only when asked for; LIMe's mechanism
reads in one place; the README is the way in, not the manual. Lines are not counted: clarity, not
a budget, sets length.
"""
import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
CARD = ['lime.py', 'train.py', 'sample.py', 'prepare.py', 'test_lime.py',
        'configurator.py', 'bookkeeping.py']
FOLDERS = {p.name for p in ROOT.iterdir() if p.is_dir() and any(p.glob('*.py'))}


def lines(name):
    return (ROOT / name).read_text(encoding='utf-8').splitlines()


def test_the_top_level_python_files_are_the_card():
    assert sorted(p.name for p in ROOT.glob('*.py')) == sorted(CARD)


def test_the_card_has_no_line_over_100_characters():
    long = [f"{name}:{i}" for name in CARD for i, line in enumerate(lines(name), 1)
            if len(line) > 100]
    assert not long, f"lines over 100 characters: {long}"


def test_no_top_level_file_imports_a_folder_at_module_level():
    # Inside a function or a branch is fine: lab.evaluate when a task is scored, the
    # hyper-connections baseline when a model has them.
    assert {'lab', 'baselines'} <= FOLDERS
    found = []
    for name in CARD:
        for node in ast.parse((ROOT / name).read_text(encoding='utf-8')).body:
            modules = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                       [node.module or ''] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{name}: {m}" for m in modules if m.split('.')[0] in FOLDERS]
    assert not found, found


def test_the_readme_stays_the_way_in():
    readme = (ROOT / 'README.md').read_text(encoding='utf-8')
    # The text is counted, not a figure's source (a Mermaid diagram, drawn where it is read).
    text = re.sub(r'^```mermaid\n.*?^```\n', '', readme, flags=re.M | re.S)
    assert len(text) <= 16000, len(text)
    # What LIMe is comes right after the quick start, before results and the file map.
    order = [readme.index(h) for h in ('## Quick start', '## How LIMe differs from GPT',
                                       '## Reading order', '## Headline result', '## Files')]
    assert order == sorted(order), order


def test_limes_mechanism_reads_in_one_sitting():
    # From the first router to the line where attention fills the layer memory: the whole method.
    model = lines('lime.py')
    start = next(i for i, line in enumerate(model) if line.startswith('class StaticRouter'))
    end = next(i for i, line in enumerate(model) if 'memory[self.layer_idx] = kv' in line)
    assert 0 < end - start < 150, (start, end)


def test_the_readme_file_map_names_every_file_of_config_lab_and_exercises():
    # A folder's __init__.py is the folder itself; every other file is named, by its name or
    # its stem, in the README's file map.
    readme = (ROOT / 'README.md').read_text(encoding='utf-8')
    files = readme[readme.index('## Files'):]
    files = files[:files.index('\n## ', 1)] if '\n## ' in files[1:] else files
    unnamed = [str(path.relative_to(ROOT)) for folder in ('config', 'lab', 'exercises')
               for path in sorted((ROOT / folder).iterdir())
               if path.is_file() and path.name != '__init__.py'
               and not re.search(rf'(?<![\w-]){re.escape(path.stem)}\b', files)]
    assert not unnamed, f"the README's file map does not name {unnamed}"
