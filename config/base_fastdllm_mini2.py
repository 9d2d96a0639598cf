# Table 2 in miniature v2 (docs/table2_miniature.md): the settings the v2 fine-tunes share, executed first by each of
# them (not a run on its own). One CPU process per run, no DeepSpeed, fp32.
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_fastdllm_mini.py")).read())
data = "data/mini2/train.jsonl"  # python -m fastdllm.mini_data_v2
val_data = "data/mini2/val_rows.jsonl"  # 64 fixed validation rows: the SFT loss on them, one basis for every objective
val_interval = 25
init_from = "reference/mini2/adapt"  # stage B v2 (scripts/table2/study.py --study=v2 makes it)
max_length = 416  # every row fits (fastdllm/mini_data_v2.py --max_tokens)
# a schedule that ends: short warm-up, cosine to min_lr = 0 (the trainer's default) at the last step; 300 steps x 32
# rows (0.32 epoch of train.jsonl); checkpoints every 50 steps (save_interval, as v1). The learning rate (3e-4 here,
# as v1) is the pilot's choice from 3e-4 and 1e-3, passed by scripts/table2/study.py; grad_clip stays the authors'
# 1.0 (HF Trainer's max_grad_norm) for every objective.
max_iters = 300
warmup_iters = 15
lr_decay_iters = 300
