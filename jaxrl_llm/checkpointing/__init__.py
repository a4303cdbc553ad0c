"""checkpointing."""
