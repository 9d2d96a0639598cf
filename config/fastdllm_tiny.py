# Tiny random Qwen2 (hidden 64, 2 layers) on CPU: a smoke run of the whole Fast-dLLM v2 pipeline, with
# TrainConfig's defaults otherwise (objective relay, DeepSpeed ZeRO-3: its CPU accelerator with gloo;
# --deepspeed= for plain DDP / one process).
#   torchrun --nproc_per_node=2 train_fastdllm.py config/fastdllm_tiny.py --objective=relay
# The first DeepSpeed start JIT-compiles a communication op (about 45 s, cached afterwards).
out_dir = "out/fastdllm_tiny"
init_from = "tiny"
data = "toy"  # synthetic chats generated in memory; or a fastdllm/data.py output
device = "cpu"
dtype = "float32"
gradient_checkpointing = False
zero_persistence_threshold = 0  # shard even the tiny parameters, so ZeRO-3 really partitions
gradient_accumulation_steps = 2
effective_batch = 0  # any number of processes
max_iters = 8
save_interval = 4
lr_decay_iters = 8
warmup_iters = 0
learning_rate = 3e-3
min_lr = 3e-4
