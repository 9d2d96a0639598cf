# Table 2 in miniature v3, part P (docs/table2_v3_protocol.md): the settings the v3 fine-tunes share, executed first by
# each of them (not a run on its own). The authors' run in miniature: 200 optimizer steps of 2 rows x 16 micro-steps,
# one learning rate for every objective, warm-up 85 then a cosine over 2,811 steps (99.6% of the peak at step 200),
# clip 1.0, checkpoint 200 as the model. One CPU process per run, no DeepSpeed, fp32.
import os
exec(open(os.path.join(os.path.dirname(__file__), "base_fastdllm_mini.py")).read())
data = "data/mini3/train.jsonl"  # python -m fastdllm.mini_data_v2 --n_adapt_tasks=30000 --out_dir=data/mini3
val_data = "data/mini3/val_rows.jsonl"  # the SFT loss on 64 fixed validation rows, logged for the record
val_interval = 25
init_from = "reference/mini3/b3"  # B3, kept by scripts/table2/study.py --study=v3
max_length = 416  # every row fits (fastdllm/mini_data_v2.py --max_tokens)
device_batch_size = 2
gradient_accumulation_steps = 16
# learning_rate: base_fastdllm_mini.py's 3e-4, the rate B3 plateaus at (the protocol's rule), the same for every
# objective; the schedule, min_lr and max_iters are the trainer's defaults, the authors' run: warm-up 85, cosine over
# 2,811 steps to 0, stopped at step 200
save_interval = 100
log_interval = 1
