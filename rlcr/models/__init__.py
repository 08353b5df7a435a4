"""Model weights: where they come from (SmolLM2, any Hugging Face model, the tiny test model), LoRA adapters,
how weights move into the engines, and chat rendering (docs/architecture.md)."""
