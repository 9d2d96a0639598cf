# The settings the four cpu_* presets share, executed first by each of them (not a run on its own): a small run
# that visibly learns in about 10 minutes on a 2-core CPU (docs/results.md). 0.8M parameters instead of 7.1M and learned
# positions on top of RoPE; objective, loss, buffer and tau as in the paper.
n_head = 4
n_embd = 128
d_ff = 512
dropout = 0.0
# learned positions: not in the paper; a small RoPE-only model learns Sudoku far slower (docs/reference.md, "Learned positions")
pos_emb = True
batch_size = 128
learning_rate = 1e-3
warmup_iters = 100
max_iters = 400  # a K=2 step costs about twice an MLM step (cpu_mlm.py runs 800)
eval_interval = 200  # an early evaluation is slow: an untrained model commits ~1 cell per forward
eval_puzzles = 500
log_interval = 25
device = "cpu"
# fp32: bf16 autocast is ~1.4x faster on CPUs with avx512_bf16 (`grep avx512_bf16 /proc/cpuinfo`; then add
# --dtype=bfloat16) but 4x SLOWER without it (AVX2-only machine, 1 busy thread: 12.4 vs 3.2 s/step)
dtype = "float32"
