"""``make chaos``: continuous faults on the whole stack in real pods, judged afterwards by the history checker."""
