"""Makes a tiny random-weight model for real vLLM tests (no hub access).

usage: make_model.py KIND OUT_DIR TOKENIZER_DIR [LORA_OUT_DIR]
KIND: qwen3 (4 full-attention layers) or gemma3-hybrid (3 sliding-window
layers, window 64, then 1 full-attention layer). Output is noise; prefix
caching and KV events are real. Fixed seed: the same files every time.
A LoRA adapter (peft, rank 8, random) is written too when LORA_OUT_DIR is given.
"""
import os
import shutil
import sys

import torch

kind, out, tok = sys.argv[1], sys.argv[2], sys.argv[3]
lora_out = sys.argv[4] if len(sys.argv) > 4 else None
torch.manual_seed(1337)
common = dict(
    vocab_size=151936,
    hidden_size=512,
    intermediate_size=1024,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
    torch_dtype="bfloat16",
)
if kind == "qwen3":
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(**common)
    model = Qwen3ForCausalLM(cfg)
elif kind == "gemma3-hybrid":
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        sliding_window=64,
        **common,
    )
    model = Gemma3ForCausalLM(cfg)
else:
    sys.exit(f"unknown model kind {kind!r}")
model = model.to(torch.bfloat16)
tmp = out + ".tmp"
shutil.rmtree(tmp, ignore_errors=True)
model.save_pretrained(tmp, safe_serialization=True)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(tok, f), os.path.join(tmp, f))
if lora_out:
    from peft import LoraConfig, get_peft_model

    lcfg = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft_model = get_peft_model(model, lcfg)
    ltmp = lora_out + ".tmp"
    shutil.rmtree(ltmp, ignore_errors=True)
    peft_model.save_pretrained(ltmp)
    shutil.rmtree(lora_out, ignore_errors=True)
    os.rename(ltmp, lora_out)
shutil.rmtree(out, ignore_errors=True)
os.rename(tmp, out)
print(out)
