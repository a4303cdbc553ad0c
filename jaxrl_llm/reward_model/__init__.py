"""Reward models (RLHF): the policy's decoder plus a linear score head, trained with the
Bradley-Terry loss from pairwise preferences, or per step from stepwise labels (a process
reward model). The same pairs also train the policy directly: Direct Preference Optimization
(objective="dpo", its loss in objectives/preference.py).

  data.py     preference rows {prompt, chosen, rejected[, margin]} (JSONL / parquet, text or chat
              messages), the held-out split, the built-in arithmetic pairs with a known gold reward,
              token arrays
  loss.py     the Bradley-Terry loss (margin, centring) and the pairwise metrics (accuracy, margin, ECE)
  process.py  process reward models (objective="process"): TRL's stepwise rows, the built-in chained
              sums, the per-step cross-entropy and metrics, the step ends of a sampled response
  scorer.py   the score head, r(x, y) at the last real token, a trained reward model read back
  export.py   a Hugging Face <Family>ForSequenceClassification folder (a PRM: ...ForTokenClassification)
  config.py   the run's config sections, DPO's `dpo` among them (keys and defaults: defaults.py)

The training loop is reward_model/trainer.py; `python -m jaxrl_llm.reward_model` runs it.
"""
