# Table 2 in miniature v3, Rollout (K = 2, no relay). Shared settings: config/base_fastdllm_mini3.py.
#   python train_fastdllm.py config/fastdllm_mini3_rollout.py --seed=1 --out_dir=runs/mini3/p/rollout_s1
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_fastdllm_mini3.py")).read())
objective = "rollout"
out_dir = "runs/mini3/p/rollout"
