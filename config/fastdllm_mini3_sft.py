# Table 2 in miniature v3, Vanilla SFT. Shared settings: config/base_fastdllm_mini3.py.
#   python train_fastdllm.py config/fastdllm_mini3_sft.py --seed=1 --out_dir=runs/mini3/p/sft_s1
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_fastdllm_mini3.py")).read())
objective = "sft"
out_dir = "runs/mini3/p/sft"
