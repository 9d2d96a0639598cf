# Table 1, Rollout: K=2 on-policy steps, no relay, tied embeddings, at the paper's settings
# (design note sudoku.md 1-3: xtiny model, batch 512, AdamW 5e-4, warmup 2000, clip 0.5, 300k steps, EMA 0.9999).
# Three seeds: python train_sudoku.py config/rollout_tied.py --seed=2 --out_dir=out/rollout_tied_s2
objective = "rollout"
tie_embeddings = True
out_dir = "out/rollout_tied"
seed = 1
batch_size = 512
max_iters = 300_000
eval_interval = 5000
eval_split = "test"  # the authors validate on the first 100 batches x 512 of the test split
eval_puzzles = 51_200
