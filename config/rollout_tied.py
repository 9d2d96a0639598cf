# Table 1, Rollout: K=2 on-policy steps, no relay, tied embeddings, at the paper's settings (config/base_table1.py).
# Three seeds: python train_sudoku.py config/rollout_tied.py --seed=2 --out_dir=out/rollout_tied_s2
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_table1.py")).read())
objective = "rollout"
tie_embeddings = True
out_dir = "out/rollout_tied"
