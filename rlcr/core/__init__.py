"""The method's formulas (rewards, masks, advantages, loss, calibration metrics): pure Python and PyTorch,
no Ray, vLLM, Prefect or storage (docs/architecture.md)."""
