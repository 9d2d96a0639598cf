# Table 1, MLM baseline (random-t masking, token-mean CE), tied embeddings, at the paper's settings (config/base_table1.py).
# Three seeds: python train_sudoku.py config/mlm_tied.py --seed=2 --out_dir=out/mlm_tied_s2
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_table1.py")).read())
objective = "mlm"
tie_embeddings = True
out_dir = "out/mlm_tied"
