# Table 1, Relay (sg): relay state carried, gradient stopped at every step, tied embeddings, at the paper's settings (config/base_table1.py).
# Three seeds: python train_sudoku.py config/relay_sg_tied.py --seed=2 --out_dir=out/relay_sg_tied_s2
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_table1.py")).read())
objective = "relay_sg"
tie_embeddings = True
out_dir = "out/relay_sg_tied"
