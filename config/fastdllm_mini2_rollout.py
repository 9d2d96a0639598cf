# Table 2 in miniature v2, Rollout (K = 2, no relay). Shared settings: config/base_fastdllm_mini2.py.
#   python train_fastdllm.py config/fastdllm_mini2_rollout.py --seed=1 --out_dir=runs/mini2/rollout_s1
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_fastdllm_mini2.py")).read())
objective = "rollout"
out_dir = "runs/mini2/rollout"
