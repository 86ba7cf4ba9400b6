"""``haiscale``: HFAiLab's parallel-training helpers as scripts import them (docs/haiscale.md).

``haiscale.ddp`` (hfreduce data parallelism), ``haiscale.fsdp`` (torch's FSDP) and
``haiscale.pipeline`` (pipeline parallelism on torch's schedules). Import the submodule you use;
importing ``haiscale`` alone loads none of them.
"""
