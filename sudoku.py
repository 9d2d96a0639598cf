"""Sudoku board logic shared by data preparation, training, sampling and tests.

Boards are 81 cells in row-major order. The token vocabulary is the one of the
paper's code (xlm-core's SimpleSpaceTokenizer for numbers, 17 ids):

    [PAD]=0 [CLS]=1 [MASK]=2 [EOS]=3 [BOS]=4 [SEP]=5 [UNK]=6 '0'..'9' = 7..16

Blank cells become [MASK] directly, so the ids that actually occur are 2 and 8..16.
"""
import numpy as np

PAD, CLS, MASK, EOS, BOS, SEP, UNK = 0, 1, 2, 3, 4, 5, 6
DIGIT0 = 7  # id of the digit '0'; digit d has id DIGIT0 + d
VOCAB_SIZE = 17
N_CELLS = 81


def digits_to_tokens(digits: np.ndarray) -> np.ndarray:
    """Digits 0..9 (0 = blank), any shape -> token ids (blank -> [MASK]) as int64."""
    digits = np.asarray(digits)
    return np.where(digits == 0, MASK, digits + DIGIT0).astype(np.int64)


def tokens_to_digits(tokens: np.ndarray) -> np.ndarray:
    """Token ids -> digits 1..9, with 0 for [MASK] and any non-digit id (as the paper's legality check)."""
    tokens = np.asarray(tokens)
    digits = tokens.astype(np.int64) - DIGIT0
    return np.where((digits >= 1) & (digits <= 9), digits, 0)
