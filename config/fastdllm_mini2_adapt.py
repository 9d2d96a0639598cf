# Table 2 in miniature v2, stage B: the pretrained small Qwen2 (stage A, reference/mini/pretrain) adapted to block
# diffusion with the Fast-dLLM v2 objective on docstring -> function pairs of the code corpus
# (python -m fastdllm.mini_data_v2: adapt.jsonl). The v2 task family stays out of B, as the paper's fine-tuning set
# is not the data its base was adapted on (docs/table2_miniature.md says how that was decided).
#   torchrun --nproc_per_node=2 train_fastdllm.py config/fastdllm_mini2_adapt.py    # 2 cores (8 x 2 x 2 = 32 per step)
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_fastdllm_mini.py")).read())
objective = "sft"
init_from = "reference/mini/pretrain"  # stage A, shared with v1
data = "data/mini2/adapt.jsonl"
out_dir = "runs/mini2/adapt"
max_length = 416  # every row fits (fastdllm/mini_data_v2.py --max_tokens)
gradient_accumulation_steps = 2  # per process, for the two torchrun processes
max_iters = 400
warmup_iters = 15
lr_decay_iters = 400
learning_rate = 1e-3
min_lr = 1e-4
save_interval = 100
