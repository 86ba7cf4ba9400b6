"""``ffrecord``: HFAiLab's ffrecord package as its users import it, served by :mod:`hfai.data`."""
