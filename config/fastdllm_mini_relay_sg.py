# Table 2 in miniature, Relay (sg) row: the relay carried between the K=2 forwards but detached.
# Shared settings: config/base_fastdllm_mini.py. Three seeds: --seed=1,2,3 (v1's study ran them; its driver: commit d94d7a2).
#   python train_fastdllm.py config/fastdllm_mini_relay_sg.py --seed=1 --out_dir=runs/mini/relay_sg_s1
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_fastdllm_mini.py")).read())
objective = "relay_sg"
out_dir = "runs/mini/relay_sg"
