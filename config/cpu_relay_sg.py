# A small relay_sg run that visibly learns in about 10 minutes on a 2-core CPU (see README).
# 0.8M parameters instead of 7.1M and learned positions on top of RoPE; objective, loss, buffer and tau as in the paper.
objective = "relay_sg"
out_dir = "out/cpu_relay_sg"
n_layer = 4
n_head = 4
n_embd = 128
d_ff = 512
dropout = 0.0
pos_emb = True  # learned positions: not in the paper; a small RoPE-only model learns Sudoku far slower (see README)
batch_size = 128
learning_rate = 1e-3
warmup_iters = 100
max_iters = 500  # a K=2 step costs about twice an MLM step
eval_interval = 250
eval_puzzles = 500
log_interval = 25
device = "cpu"
dtype = "bfloat16"  # bf16 autocast: faster on CPUs with avx512_bf16; use "float32" elsewhere
