# Table 2 in miniature v2, Relay (sg) (relay state passed, not backpropagated). Shared settings: config/base_fastdllm_mini2.py.
#   python train_fastdllm.py config/fastdllm_mini2_relay_sg.py --seed=1 --out_dir=runs/mini2/relay_sg_s1
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_fastdllm_mini2.py")).read())
objective = "relay_sg"
out_dir = "runs/mini2/relay_sg"
