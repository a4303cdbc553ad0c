"""The one optimizer step under every loss (learner.py) and the optimizer it applies (optim.py).

Below training/ and reward_model/: the RL update, the warm start's SFT, the
reward models and DPO are loss functions on `Learner`."""
