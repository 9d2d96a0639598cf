# Table 2 in miniature v2, stage B: the pretrained small Qwen2 (stage A, reference/mini/pretrain) adapted to block
# diffusion with the Fast-dLLM v2 objective on docstring -> function pairs of the code corpus and 8,000 task rows of
# the training compositions (python -m fastdllm.mini_data_v2 --n_adapt_tasks=8000: adapt.jsonl). Without the task
# rows, SFT reached 14% validation pass@1 after C, under the protocol's 25-75% band (docs/table2_v2_protocol.md).
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
