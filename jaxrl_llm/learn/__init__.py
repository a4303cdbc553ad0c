"""What every run's learning shares: the one optimizer step under every loss (learner.py), the
optimizer it applies (optim.py) and the run shell around the steps (shell.py).

Below training/ and reward_model/: the RL update, the warm start's SFT, the
reward models and DPO are loss functions on `Learner`, and the RL trainer and
the reward-model run share `RunShell`."""
