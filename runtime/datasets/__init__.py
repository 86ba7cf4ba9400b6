"""``hfai.datasets``: the cluster's prepared datasets as ffrecord files (ImageNet, CLUE, LTSF, ...)."""
