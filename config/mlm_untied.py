# Table 1, MLM baseline (random-t masking, token-mean CE), untied embeddings, at the paper's settings (config/base_table1.py).
# Three seeds: python train_sudoku.py config/mlm_untied.py --seed=2 --out_dir=out/mlm_untied_s2
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_table1.py")).read())
objective = "mlm"
tie_embeddings = False
out_dir = "out/mlm_untied"
