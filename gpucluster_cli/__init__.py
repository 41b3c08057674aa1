"""``gpucluster``: the researchers' front door to training on the cluster (submit, list, status, logs, cancel).

Installed on its own (``pip install ./cli``): the CLI and the pure modules it shares with the stack, no Pulumi.
"""

#: The CLI's version (``--version``), read by its distribution (cli/pyproject.toml) too.
__version__ = "0.1.0"
