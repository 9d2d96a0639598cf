"""The Sudoku experiment's internals (Table 1): board logic, data files, decoding, reports. The entry
points are at the repository root: prepare_data.py, train_sudoku.py, sample.py, quickstart.py."""
