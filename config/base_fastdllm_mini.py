# Table 2 in miniature (docs/table2_miniature.md): the settings the mini presets share, executed first by each of them
# (not a run on its own). One CPU process per run, no DeepSpeed, fp32; only scale, tokenizer and data differ from
# the 1.5B run (config/fastdllm_sft.py, config/fastdllm_relay.py).
device = "cpu"
dtype = "float32"
deepspeed = ""
gradient_checkpointing = False
data = "data/mini/tasks_train.jsonl"  # python -m fastdllm.mini_data
init_from = "reference/mini/adapt"  # stage B, the "Fast-dLLM v2" row of the table (v1's study made it: scripts/table2/mini_study.py at commit d94d7a2)
max_length = 256  # every row fits (fastdllm/mini_data.py --max_tokens)
# 32 sequences per optimizer step, as the paper's text; 8 x 4 on one process (the study's lanes), 8 x 2 x 2 under torchrun
device_batch_size = 8
gradient_accumulation_steps = 4
effective_batch = 32
# the 1.5B run's schedule as it is (the trainer's defaults: warm-up 85, cosine over 2,811 steps, stopped at step 200),
# with a learning rate for a 2.6M-parameter model instead of 5e-6
learning_rate = 3e-4
save_interval = 50  # ckpt-50 ... ckpt-200: the gap read against fine-tuning compute
log_interval = 10
