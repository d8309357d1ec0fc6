"""Prints the token ids HF transformers produces for growing prefixes of one
conversation, each wrapped as one user message with the generation prompt
(apply_chat_template, then encode without special tokens): what a gateway
re-sending a conversation each turn must get back through the prefix cache.

usage: hf_growing_golden.py MODEL_DIR > qwen3_growing_golden.json
"""
import json
import sys

from transformers import AutoTokenizer

TURNS = [
    "User: Summarise the design of a cache-aware router in three sentences.\n",
    "Assistant: The router keeps an index of which replica holds which prefix "
    "blocks; each request is hashed into blocks and sent to the replica with the "
    "longest match. Misses fall back to load-based choice.\n\n",
    "User: And in Chinese? 请用中文回答，谢谢！\n",
    "Assistant: 路由器维护一个索引，记录每个副本持有哪些前缀块。每个请求被切分成块并"
    "哈希，然后发送到匹配最长的副本。🚀👍🏽\n",
    "User: Numbers: 1234567890, 3.14159, 2026-12-03T16:13:08Z; ids 0x1f 0b1010.\n",
    "Assistant: Noted — café, naïve, e\u0301 (combining), Ω, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢.\n",
    "User: Code:\n```rust\nfn main() {\n    let x = vec![1, 2, 3];\n\tprintln!(\"{x:?}\");\n}\n```\n",
    "Assistant: The text <|im_start|>user and <think>hmm</think> and "
    "<|im_end|> appear literally here.   \n\n\n   Whitespace runs   end here.\n",
    "User: Don't stop; it's fine, we'll see. They're here, I'm sure, you've seen it, he'd go.\n",
]


def main() -> None:
    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    text = "".join(TURNS * 4)
    # Turn ends, and points mid-word / mid-sentence between them.
    ends, pos = [], 0
    for t in TURNS * 4:
        ends.append(pos + len(t) // 2)
        pos += len(t)
        ends.append(pos)
    turns = []
    for end in ends:
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": text[:end]}], tokenize=False, add_generation_prompt=True)
        turns.append({"end": end, "ids": tok.encode(rendered, add_special_tokens=False)})
    json.dump({"text": text, "turns": turns}, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
