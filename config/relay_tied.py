# Table 1, Relay: K=2 truncated BPTT through the relay state, tied embeddings, at the paper's settings (config/base_table1.py).
# Three seeds: python train_sudoku.py config/relay_tied.py --seed=2 --out_dir=out/relay_tied_s2
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_table1.py")).read())
objective = "relay"
tie_embeddings = True
out_dir = "out/relay_tied"
