# Table 2 in miniature v3, Relay (K = 2, backpropagation through the relay). Shared settings: config/base_fastdllm_mini3.py.
#   python train_fastdllm.py config/fastdllm_mini3_relay.py --seed=1 --out_dir=runs/mini3/p/relay_s1
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_fastdllm_mini3.py")).read())
objective = "relay"
out_dir = "runs/mini3/p/relay"
