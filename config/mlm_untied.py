# Table 1, MLM baseline (random-t masking, token-mean CE), untied embeddings, at the paper's settings
# (paper App. A.1: xtiny model, batch 512, AdamW 5e-4, warmup 2000, clip 0.5, 300k steps; EMA 0.9999 as in the authors' runs).
# Three seeds: python train_sudoku.py config/mlm_untied.py --seed=2 --out_dir=out/mlm_untied_s2
objective = "mlm"
tie_embeddings = False
out_dir = "out/mlm_untied"
seed = 1
# the paper's data: Sudoku-Extreme from the hub (python prepare_data.py --source=hf --out_dir=data/sudoku-extreme);
# train_sudoku.py refuses other data for a paper config unless --allow_any_data=True (then not comparable)
paper_config = True
data_dir = "data/sudoku-extreme"
batch_size = 512
max_iters = 300_000
eval_interval = 5000
eval_split = "test"  # the authors validate on the first 100 batches x 512 of the test split
eval_puzzles = 51_200
