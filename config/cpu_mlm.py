# A small mlm run that visibly learns in about 10 minutes on a 2-core CPU (config/base_cpu.py).
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_cpu.py")).read())
objective = "mlm"
out_dir = "out/cpu_mlm"
max_iters = 800  # fp32 on 2 idle cores: roughly 0.75 s/step
