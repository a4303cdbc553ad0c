"""envs: multi-turn environments, their tools (run in limited worker processes) and the token trace of
an episode. Kept free of imports: a tool worker imports `jaxrl_llm.envs._worker` and nothing heavier."""
