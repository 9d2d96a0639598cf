# Table 2 in miniature v2, Vanilla SFT. Shared settings: config/base_fastdllm_mini2.py.
#   python train_fastdllm.py config/fastdllm_mini2_sft.py --seed=1 --out_dir=runs/mini2/sft_s1
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_fastdllm_mini2.py")).read())
objective = "sft"
out_dir = "runs/mini2/sft"
