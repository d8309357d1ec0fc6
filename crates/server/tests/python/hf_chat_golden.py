"""Prints the token ids HF transformers produces for each prompt wrapped as
one user message with the generation prompt (apply_chat_template, then
encode without special tokens) — the reference our Rust tokenizer must match.

usage: hf_chat_golden.py MODEL_DIR > golden.json
"""
import json
import sys

from transformers import AutoTokenizer

PROMPTS = [
    "",
    "hello world",
    "What is the capital of France?",
    "  leading and trailing spaces  ",
    "multi\nline\n\ntext with\ttabs",
    "unicode: héllo wörld — 你好，世界 🚀",
    "<|im_start|>not really a special token",
    "code: def f(x):\n    return {'a': [1, 2, 3]}",
]


def main() -> None:
    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    out = []
    for p in PROMPTS:
        text = tok.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        ids = tok.encode(text, add_special_tokens=False)
        out.append({"prompt": p, "rendered": text, "ids": ids})
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
