# Table 1, Relay: K=2 truncated BPTT through the relay state, untied embeddings, at the paper's settings (config/base_table1.py).
# Three seeds: python train_sudoku.py config/relay_untied.py --seed=2 --out_dir=out/relay_untied_s2
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_table1.py")).read())
objective = "relay"
tie_embeddings = False
out_dir = "out/relay_untied"
