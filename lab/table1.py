"""
table1.py: the LIMe paper's Table 1 for a checkpoint: its eight tasks, 1-shot, scored by EleutherAI's
LM Evaluation Harness itself (optional: pip install lm-eval==0.4.13) with lab/harness.py's model.
It prints the harness's table and writes its results to out_dir/table1.json; docs/evaluation.md
holds the paper's rows, and says how to run offline. From the repo root:

    python -m lab.table1 --out_dir=out/gpt2/static
    python -m lab.table1 --out_dir=out/gpt2/static --tasks=hellaswag --limit=200 --batch_size=32
"""
import json
import os

import torch

from bookkeeping import write_whole
from configurator import configure, fail

# -----------------------------------------------------------------------------
out_dir = 'out'  # the directory holding ckpt.pt
tasks = 'arc_easy,arc_challenge,winogrande,copa,multirc,rte,hellaswag,piqa'  # the harness's names
num_fewshot = 1  # solved examples before each one, drawn by the harness (the paper's table: 1)
limit = 0  # score only each task's first this many examples; 0 = all of them
batch_size = 8  # sequences per forward
include_path = ''  # a directory of task YAML files the harness reads beside its own; '' = none
device = 'cuda' if torch.cuda.is_available() else 'cpu'
dtype = 'bfloat16'  # 'bfloat16' (autocast) or 'float32'; on a CPU the default becomes float32
# -----------------------------------------------------------------------------


def main():
    config, _, _ = configure(globals(), {
        'path': ['out_dir'], 'text': ['tasks', 'include_path'], 'positive': ['batch_size'],
        'non-negative': ['num_fewshot', 'limit'], 'device': ['device'],
        ('bfloat16', 'float32'): ['dtype']})
    globals().update(config)
    from lab import harness  # one line saying how to install lm-eval where it is missing
    import lm_eval.tasks
    from lm_eval.utils import handle_non_serializable, make_table

    model = harness.LimeLM(out_dir=out_dir, device=device, dtype=dtype, batch_size=batch_size)
    task_manager = lm_eval.tasks.TaskManager(include_path=include_path or None)
    names = tasks.split(',')
    unknown = [name for name in names if name not in task_manager.all_subtasks]
    if unknown:
        fail(f"the harness has no task {', '.join(unknown)} (nor has --include_path, if given)")
    try:
        results = lm_eval.simple_evaluate(model=model, tasks=names, num_fewshot=num_fewshot,
                                          limit=limit or None, task_manager=task_manager,
                                          log_samples=False)
    except OSError as e:  # datasets': offline and not cached, or not found
        fail(f"could not load a task's data set ({e}); docs/evaluation.md says how to run offline")
    print(make_table(results))
    path = os.path.join(out_dir, 'table1.json')
    text = json.dumps(results, indent=1, default=handle_non_serializable)
    write_whole(path, lambda f: f.write(text.encode()))
    print(f"wrote {path}")


if __name__ == '__main__':
    main()
