# The settings the eight Table 1 presets share, executed first by each of them (not a run on its own):
# paper App. A.1: xtiny model, batch 512, AdamW 5e-4, warmup 2000, clip 0.5, 300k steps; EMA 0.9999 as in the
# authors' runs. All of that is train_sudoku.py's TrainConfig defaults, seed 1 included; what differs is the data
# and the validation set.
# the paper's data: Sudoku-Extreme from the hub (python prepare_data.py --source=hf --out_dir=data/sudoku-extreme);
# train_sudoku.py refuses other data for a paper config unless --allow_any_data=True (then not comparable)
paper_config = True
data_dir = "data/sudoku-extreme"
eval_split = "test"  # the authors validate on the first 100 batches x 512 of the test split
eval_puzzles = 51_200
