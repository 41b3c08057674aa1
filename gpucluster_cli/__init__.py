"""``gpucluster``: the researchers' front door to training on the cluster (submit, list, status, logs, cancel)."""
