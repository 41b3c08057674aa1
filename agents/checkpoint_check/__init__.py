"""Checkpoint throughput check: the fio result reducer run at the end of the in-cluster fio job."""
