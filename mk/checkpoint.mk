# Checkpoint storage (issue 5): the fio binary the reducer tests drive, and the checkpoint tests.
# `make test` depends on `checkpoint-tools` so Debian's fio exists before pytest runs.

.PHONY: checkpoint-tools checkpoint-test

# Debian's fio (3.33 on bookworm) produces the JSON the in-cluster reducer parses; the tests run it
# for real on a temporary directory. The guard keeps a machine that already has it from touching apt.
checkpoint-tools: venv
	@command -v fio >/dev/null || $(call apt_install,fio)

checkpoint-test: checkpoint-tools
	.venv/bin/pytest -q tests/test_checkpoint.py tests/test_checkpoint_config.py tests/test_checkpoint_sizing.py \
		tests/test_fio_reducer.py
