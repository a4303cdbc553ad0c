"""Reward models from pairwise preferences (RLHF): the policy's decoder plus a linear score head,
trained with the Bradley-Terry loss.

  data.py     preference rows {prompt, chosen, rejected[, margin]} (JSONL / parquet, text or chat
              messages), the held-out split, the built-in arithmetic pairs with a known gold reward,
              token arrays
  loss.py     the Bradley-Terry loss (margin, centring) and the pairwise metrics (accuracy, margin, ECE)
  scorer.py   the score head, r(x, y) at the last real token, a trained reward model read back
  export.py   a Hugging Face <Family>ForSequenceClassification folder
  config.py   the run's config sections (keys and defaults: defaults.py)

The training loop is training/reward_loop.py; `python -m jaxrl_llm.reward_model` runs it.
"""
