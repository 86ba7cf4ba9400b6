"""``ffrecord.torch``: the torch Dataset and DataLoader of HFAiLab's ffrecord, served by :mod:`hfai.data`."""
