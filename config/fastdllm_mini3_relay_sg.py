# Table 2 in miniature v3, Relay (sg) (relay state passed, not backpropagated). Shared settings: config/base_fastdllm_mini3.py.
#   python train_fastdllm.py config/fastdllm_mini3_relay_sg.py --seed=1 --out_dir=runs/mini3/p/relay_sg_s1
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_fastdllm_mini3.py")).read())
objective = "relay_sg"
out_dir = "runs/mini3/p/relay_sg"
