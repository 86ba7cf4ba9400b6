"""``haiscale``: HFAiLab's parallel-training helpers (ddp, fsdp, pipeline) as scripts import them."""
