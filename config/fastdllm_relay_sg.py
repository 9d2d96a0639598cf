# Relay (sg) row of Table 2: the relay state is passed between the two forwards but detached.
# Everything else is the paper's setting, train_fastdllm.py's TrainConfig defaults: Fast-dLLM v2 1.5B, c40m60
# mixture, 2 GPUs, DeepSpeed ZeRO-3, bf16, gradient checkpointing, per-device batch 2, accumulation 16, lr 5e-6
# cosine with 3% warmup, clip 1.0, 200 steps (the paper's checkpoint-200 is this run's ckpt-200/).
#   python -m fastdllm.data
#   torchrun --nproc_per_node=2 train_fastdllm.py config/fastdllm_relay_sg.py
objective = "relay_sg"
out_dir = "out/fastdllm_relay_sg"
