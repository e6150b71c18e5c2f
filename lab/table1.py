"""
table1.py: the LIMe paper's Table 1 for a checkpoint: its eight tasks scored 1-shot by EleutherAI's
LM Evaluation Harness itself (an optional dependency: pip install lm-eval==0.4.13), through
lab/harness.py. From the repo root:

    python -m lab.table1 --out_dir=out/gpt2                              # the eight tasks, 1-shot
    python -m lab.table1 --out_dir=out/gpt2 --tasks=hellaswag,piqa --limit=200 --batch_size=32
    python -m lab.table1 --out_dir=out/gpt2 --include_path=tasks/local  # task files of one's own

It prints one row per task, acc and acc_norm (where the task has one) with their standard errors,
then their means, beside the paper's rows (PAPER), and writes all of it as JSON to
--json_file (out_dir/table1.json by default). The tasks' data sets come from the Hugging Face hub,
or from its cache: offline (HF_DATASETS_OFFLINE=1, HF_HUB_OFFLINE=1) they must be in the cache, or
--include_path names a directory of task YAML files that point the tasks at local files. The
harness then reads those before its own, and a file there may define a task of the same name.
docs/evaluation.md says how to fill the cache, and how such a file looks.
"""
import os

import torch

from configurator import configure, fail
from lime import last_line
from bookkeeping import write_json

# -----------------------------------------------------------------------------
out_dir = 'out'  # the directory holding ckpt.pt
tasks = 'arc_easy,arc_challenge,winogrande,copa,multirc,rte,hellaswag,piqa'  # the harness's names
num_fewshot = 1  # solved examples before each one, drawn by the harness (the paper's table: 1)
limit = 0  # score only each task's first this many examples; 0 = all of them
batch_size = 8  # sequences per forward
include_path = ''  # a directory of task YAML files the harness reads before its own; '' = none
json_file = ''  # where the scores go as JSON; '' = out_dir/table1.json
seed = 1234  # the harness's fewshot_random_seed (its default), which draws the solved examples
device = 'cuda' if torch.cuda.is_available() else 'cpu'
dtype = 'bfloat16'  # 'bfloat16' (autocast) or 'float32'; on a CPU the default becomes float32
# -----------------------------------------------------------------------------

# The paper's Table 1 (1.2B models trained on 42B tokens, 1-shot; the authors' README,
# corl-team/lime): {row: {task: accuracy in %}}, printed beside ours. Which of acc and acc_norm
# each task's number is, the table does not say.
COLUMNS = ['arc_easy', 'arc_challenge', 'winogrande', 'copa', 'multirc', 'rte', 'hellaswag', 'piqa',
           'mean']  # the harness's task names, in the paper's order, and their mean
PAPER = {row: dict(zip(COLUMNS, numbers)) for row, numbers in {
    'LLaMA': [69.5, 38.7, 55.2, 75.0, 42.8, 54.5, 53.1, 72.5, 57.7],
    'HC': [70.1, 38.4, 53.0, 77.0, 42.9, 51.6, 54.4, 73.5, 57.6],
    'LIMe Dynamic': [72.7, 39.5, 53.1, 79.0, 43.0, 52.4, 54.4, 72.9, 58.4],
    'LIMe Static': [71.1, 39.3, 56.2, 75.0, 43.1, 55.2, 53.9, 72.2, 58.3],
}.items()}


def load_tasks(names, task_manager):
    """{name: the harness's task}, each loaded alone so that a failure names its task."""
    known = set(task_manager.all_subtasks)
    loaded = {}
    for name in names:
        if name not in known:
            import difflib
            close = ', '.join(difflib.get_close_matches(name, sorted(known), n=3))
            fail(f"the harness has no task '{name}'" + (f"; did you mean {close}?" if close else "")
                 + (f" (nor has {include_path})" if include_path else ""))
        try:
            loaded[name] = task_manager.load_task_or_group([name])[name]
        except Exception as e:  # datasets' errors: offline and not cached, a file not found, ...
            offline = os.environ.get('HF_DATASETS_OFFLINE') == '1' or \
                os.environ.get('HF_HUB_OFFLINE') == '1'
            fail(f"{name}: could not load its data set ({last_line(e)})"
                 + ("; offline, it must be in the Hugging Face cache, or --include_path must point"
                    " the task at local files (docs/evaluation.md)" if offline else ""))
    return loaded


def percent(value, stderr=None):
    """A share as a percentage, with its standard error where it is a number; '-' for none."""
    if value is None:
        return '-'
    spread = f" ± {100 * stderr:.2f}" if isinstance(stderr, (int, float)) else ''
    return f"{100 * value:.2f}{spread}"


def table(scores):
    """The lines that print: a header, a row a task, the means, the paper's rows where known."""
    lines = [f"Table 1: {scores['out_dir']} (step {scores['step']}, router {scores['router']}, "
             f"{scores['dtype']}), {scores['num_fewshot']}-shot, lm-eval {scores['lm_eval']}",
             f"{'task':<16}{'acc':>16}{'acc_norm':>16}{'examples':>10}"
             + ''.join(f"{row[:12]:>13}" for row in PAPER)]
    for name, task in scores['tasks'].items():
        lines.append(f"{name:<16}{percent(task['acc'], task['acc_stderr']):>16}"
                     f"{percent(task.get('acc_norm'), task.get('acc_norm_stderr')):>16}"
                     f"{task['examples']:>10,}"
                     + ''.join(f"{PAPER[row].get(name, float('nan')):>13.1f}" for row in PAPER))
    mean = scores['mean']
    lines.append(f"{'mean':<16}{percent(mean['acc']):>16}{percent(mean['acc_norm_else_acc']):>16}"
                 f"{'':>10}" + ''.join(f"{PAPER[row].get('mean', float('nan')):>13.1f}"
                                       for row in PAPER))
    lines.append("% of examples right, ± one standard error; mean: of acc over the tasks, and\n"
                 "of acc_norm where a task has it, else acc. Then the paper's 1.2B models.")
    return lines


def main():
    config, _, _ = configure(globals(), {
        'path': ['out_dir'], 'text': ['tasks', 'include_path', 'json_file'],
        'positive': ['batch_size'], 'non-negative': ['num_fewshot', 'limit'], 'seed': ['seed'],
        'device': ['device'], ('bfloat16', 'float32'): ['dtype']})
    globals().update(config)
    names = [name.strip() for name in tasks.split(',') if name.strip()]
    if not names:
        fail("--tasks names no task: give the harness's task names, separated by commas")
    if include_path and not os.path.isdir(include_path):
        fail(f"--include_path={include_path}: not a directory (of task YAML files)")

    from lab import harness  # needs lm_eval: one line saying so if it is not installed
    import lm_eval
    from lm_eval.tasks import TaskManager

    model = harness.LimeLM(out_dir=out_dir, device=device, dtype=dtype, batch_size=batch_size)
    task_manager = TaskManager(include_path=include_path or None)
    loaded = load_tasks(names, task_manager)
    results = lm_eval.simple_evaluate(
        model=model, tasks=list(loaded.values()), num_fewshot=num_fewshot, limit=limit or None,
        task_manager=task_manager, log_samples=False, fewshot_random_seed=seed,
        random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed)

    info = model.get_model_info()
    scores = {'out_dir': out_dir, 'step': info['lime_step'], 'router': info['lime_router'],
              'dtype': info['lime_dtype'], 'device': device,
              'num_fewshot': num_fewshot, 'limit': limit, 'seed': seed,
              'lm_eval': lm_eval.__version__, 'tasks': {}}
    for name in names:
        got = results['results'][name]
        if 'acc,none' not in got:
            fail(f"{name} reports no acc (its metrics: {', '.join(sorted(got))}): Table 1's tasks "
                 "are multiple choice")
        task = {'acc': got['acc,none'], 'acc_stderr': got['acc_stderr,none'],
                'examples': results['n-samples'][name]['effective']}
        if 'acc_norm,none' in got:
            task.update(acc_norm=got['acc_norm,none'], acc_norm_stderr=got['acc_norm_stderr,none'])
        scores['tasks'][name] = task
    per_task = scores['tasks'].values()
    scores['mean'] = {'acc': sum(t['acc'] for t in per_task) / len(per_task),
                      'acc_norm_else_acc': sum(t.get('acc_norm', t['acc']) for t in per_task)
                      / len(per_task)}
    scores['paper'] = PAPER
    print('\n'.join(table(scores)))
    path = json_file or os.path.join(out_dir, 'table1.json')
    try:
        write_json(path, scores)
    except OSError as e:
        fail(f"cannot write {path}: {e.strerror} (the table above is all there is)")
    print(f"wrote {path}")


if __name__ == '__main__':
    main()
