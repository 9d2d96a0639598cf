# Table 2 in miniature, stage B: the pretrained small Qwen2 (scripts/table2/pretrain_ar.py) adapted to block diffusion with the
# Fast-dLLM v2 objective on an instruction mixture (fastdllm/mini_data.py: docstring -> function pairs and task rows of
# the training compositions). Its result is the table's "Fast-dLLM v2" row and the start of every fine-tune.
#   torchrun --nproc_per_node=2 train_fastdllm.py config/fastdllm_mini_adapt.py    # 2 cores (8 x 2 x 2 = 32 per step)
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_fastdllm_mini.py")).read())
objective = "sft"
init_from = "reference/mini/pretrain"  # stage A, kept in the repository (scripts/table2/pretrain_ar.py made it)
data = "data/mini/adapt.jsonl"
out_dir = "runs/mini/adapt"
gradient_accumulation_steps = 2  # per process, for the two torchrun processes
max_iters = 500
warmup_iters = 15
lr_decay_iters = 500
learning_rate = 1e-3
min_lr = 1e-4
save_interval = 100
