# Table 2 in miniature, Vanilla SFT row: the Fast-dLLM v2 objective (doubled [x_t || x_0], complementary masks).
# Shared settings: config/base_fastdllm_mini.py. Three seeds: --seed=1,2,3 (v1's study ran them; its driver: commit d94d7a2).
#   python train_fastdllm.py config/fastdllm_mini_sft.py --seed=1 --out_dir=runs/mini/sft_s1
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_fastdllm_mini.py")).read())
objective = "sft"
out_dir = "runs/mini/sft"
