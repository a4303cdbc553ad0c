"""Pallas kernels over the vocabulary, installed as ``jaxrl_llm.kernels``."""
