"""The code-task prompt of eval_code.py (EvalPlus 0.3.1 "instruct" recipe, docs/fastdllm.md), and the training answer
in the same wrapper, so that a model fine-tuned on `training_messages` sees at test time exactly the prompt it
was trained to continue. No torch here: eval_code.py --canonical imports it without loading a model stack."""

INSTRUCTION = "Please provide a self-contained Python script that solves the following problem in a markdown code block:"
RESPONSE = "Below is a Python script with a self-contained function that solves the problem and passes corresponding tests:"
_SPLIT = "-[[SPLIT-HERE]]-"  # stands for the completion; the rendered template is cut there


def user_message(task_prompt: str) -> str:
    return f"{INSTRUCTION}\n```\n{task_prompt.strip()}\n```\n"


def make_prompt(task_prompt: str, tokenizer) -> str:
    """The chat-formatted prompt, ending inside the assistant turn right after "```python\\n"."""
    user = user_message(task_prompt)
    assistant = f"{RESPONSE}\n```python\n{_SPLIT}\n```\n"
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    else:  # EvalPlus would send the bare task; our models are chat models, so fall back to plain ChatML
        text = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{assistant}")
    return text.split(_SPLIT)[0]


def training_messages(task_prompt: str, code: str) -> list[dict]:
    """A supervised conversation whose answer is `code` inside make_prompt's wrapper: the prompt's
    assistant prefix, the code, the closing fence (then the template's <|im_end|>, the stop token)."""
    answer = f"{RESPONSE}\n```python\n{code.rstrip(chr(10))}\n```\n"
    return [{"role": "user", "content": user_message(task_prompt)}, {"role": "assistant", "content": answer}]
