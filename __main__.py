"""The unified GPU cluster: load the stack config, build the platform, export what users look up."""

import pulumi

from components.cluster import UnifiedGpuCluster
from components.stack import load_stack_config

config = load_stack_config()
cluster = UnifiedGpuCluster("cluster", config)

pulumi.export("onpremGpus", cluster.onprem_gpus)
pulumi.export("scheduler", cluster.scheduler.scheduler_name)
pulumi.export("priorityClasses", {t.value: n for t, n in cluster.priorities.names.items()})
