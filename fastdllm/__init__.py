"""The Fast-dLLM v2 experiment's internals (Table 2): model, data, tokenizer, generation, sandbox, judging.
The entry points are at the repository root: train_fastdllm.py, eval_code.py."""
