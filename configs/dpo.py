"""Direct Preference Optimization of the policy on the built-in arithmetic pairs (correct answer over a
carry error, the pairs of configs/reward_model.py) with the tiny model: the policy learns the preference
directly, no reward model, against a frozen copy of its initial self.

    python -m jaxrl_llm.reward_model --config=configs/dpo.py --workdir=runs/dpo
    python -m jaxrl_llm.reward_model --config=configs/dpo.py --config.dpo.loss_type=robust \
        --config.dpo.label_smoothing=0.1 --config.data.label_noise=0.1

The run logs the implicit rewards beta * log(pi / pi_ref) of the chosen and rejected responses, their
margin and the share of pairs with margin > 0 (train/ and eval/ chosen, rejected, margin, accuracy);
summary.json holds the held-out pairwise accuracy at the start and the end. Start an RL run from it with
--config.init_checkpoint=runs/dpo. The loss and its variants: docs/objectives.md, section 13; keys:
jaxrl_llm/reward_model/defaults.py.
"""

from jaxrl_llm.reward_model.defaults import reward_model_config


def get_config():
  c = reward_model_config()
  c.name = "dpo"
  c.objective = "dpo"
  c.export = False  # a policy, not a score head: its checkpoints are what a later run reads
  c.dpo.beta = 0.1
  c.train.steps = 200
  c.train.lr = 3e-3
  c.train.weight_decay = 0.0  # decay would pull the policy towards zero, away from pi_ref, for no preference
  c.eval.every = 50
  return c
