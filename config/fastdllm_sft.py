# Vanilla SFT row of Table 2: the Fast-dLLM v2 objective (doubled [x_t || x_0], complementary masks).
# Paper setting: Fast-dLLM v2 1.5B, c40m60 mixture, 2 GPUs (A100 80GB), DeepSpeed ZeRO-3, bf16,
# gradient checkpointing, per-device batch 2, accumulation 16, lr 5e-6 cosine with 3% warmup,
# clip 1.0, the reported model is checkpoint-200.
#   python fastdllm_data.py
#   torchrun --nproc_per_node=2 train_fastdllm.py config/fastdllm_sft.py
out_dir = "out/fastdllm_sft"
init_from = "Efficient-Large-Model/Fast_dLLM_v2_1.5B"
data = "data/sft/train.jsonl"
objective = "sft"
deepspeed = "zero3"
dtype = "bfloat16"
gradient_checkpointing = True
batch_size = 2
gradient_accumulation_steps = 16
# 2 x 16 x 2 GPUs = 64 sequences per step is what the authors' launcher ran; the paper text says
# "effective batch size 32" (that would be gradient_accumulation_steps = 8 on 2 GPUs).
effective_batch = 64
learning_rate = 5e-6
max_iters = 200
lr_decay_iters = 2811  # the 3-epoch cosine schedule of which checkpoint-200 was taken
warmup_iters = 85
save_interval = 200
