"""jaxrl_llm: a JAX/Flax RL trainer for LLMs where every token gets a weight."""

__version__ = "0.1.0"
