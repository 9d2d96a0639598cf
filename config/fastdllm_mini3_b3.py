# Table 2 in miniature v3, B3: v2's stage B (reference/mini2/adapt) trained on with the Fast-dLLM v2 objective on a
# mixture of 3,929 docstring pairs and 30,000 task rows of training compositions (python -m fastdllm.mini_data_v2
# --n_adapt_tasks=30000 --out_dir=data/mini3: adapt.jsonl), until its validation pass@1 plateaus
# (docs/table2_v3_protocol.md). The study trains it in stages of 200 steps and decodes every 100th checkpoint.
#   python train_fastdllm.py config/fastdllm_mini3_b3.py --max_iters=100    # one core: 8 x 4 = 32 rows per step
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_fastdllm_mini.py")).read())
objective = "sft"
init_from = "reference/mini2/adapt"
data = "data/mini3/adapt.jsonl"
val_data = "data/mini3/val_rows.jsonl"  # the SFT loss on 64 fixed validation rows, for the record
val_interval = 50
out_dir = "runs/mini3/p/b3"
max_length = 416  # every row fits (fastdllm/mini_data_v2.py --max_tokens)
min_lr = 3e-4  # = learning_rate (base_fastdllm_mini.py's 3e-4): constant after the warm-up, the cosine is flat
warmup_iters = 15
lr_decay_iters = 2000
max_iters = 100
save_interval = 100
log_interval = 1
