# Table 2 in miniature, Rollout row: the K=2 on-policy rollout without a relay.
# Shared settings: config/base_fastdllm_mini.py. Three seeds: --seed=1,2,3 (v1's study ran them; its driver: commit d94d7a2).
#   python train_fastdllm.py config/fastdllm_mini_rollout.py --seed=1 --out_dir=runs/mini/rollout_s1
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_fastdllm_mini.py")).read())
objective = "rollout"
out_dir = "runs/mini/rollout"
