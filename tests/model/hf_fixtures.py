"""Tiny random Hugging Face models of each family, built with transformers:
the reference for parity and round-trip tests."""

import torch
import transformers

VOCAB = 96


def hf_config(family: str, tie: bool | None = None):
  common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, rms_norm_eps=1e-6, max_position_embeddings=128)
  if family == "qwen2":
    return transformers.Qwen2Config(num_key_value_heads=2, tie_word_embeddings=bool(tie),
                                    rope_parameters={"rope_type": "default",
                                                     "rope_theta": 1000.0}, **common)
  if family == "qwen3":
    # head_dim 32 != hidden/heads = 16, and linear RoPE scaling.
    return transformers.Qwen3Config(num_key_value_heads=2, head_dim=32,
                                    tie_word_embeddings=True if tie is None else tie,
                                    rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                     "rope_theta": 10000.0}, **common)
  if family == "llama":
    # Llama 3 scaling with a short original context so all three bands occur.
    rope = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
            "rope_theta": 10000.0}
    return transformers.LlamaConfig(num_key_value_heads=1, tie_word_embeddings=bool(tie),
                                    rope_parameters=rope, **common)
  raise ValueError(family)


def build_hf_model(family: str, seed: int = 0, tie: bool | None = None):
  """A random model with every tensor (biases and norm scales too) non-trivial."""
  torch.manual_seed(seed)
  cfg = hf_config(family, tie)
  cfg._attn_implementation = "eager"
  model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      else:
        p.copy_(0.15 * torch.randn_like(p))
  return model.eval()
