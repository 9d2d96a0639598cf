# A small relay run that visibly learns in about 10 minutes on a 2-core CPU (config/base_cpu.py).
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_cpu.py")).read())
objective = "relay"
out_dir = "out/cpu_relay"
