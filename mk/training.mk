# Training runtime (issue 14): `make train-demo` runs the PyTorch reference trainer as a gang on this machine.
# PyTorch stays out of `make test`: its PyPI wheel pulls 3.0 GB of CUDA libraries even for CPU use (measured
# cold: 349 s and 5.3 GB on a 2-core CI machine), so it lives in its own virtualenv, installed on first use.
# `make test` covers the gang restart through the framework-free core with real processes instead.

TORCH_VENV := $(STATE)/torch-venv
TORCH_PIN := torch==2.15.0

.PHONY: train-demo training-lint

$(TORCH_VENV)/.installed: requirements.txt
	@test -x $(TORCH_VENV)/bin/python || python3 -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/python -m pip install -q --disable-pip-version-check $(TORCH_PIN) \
		$$(grep -E '^(numpy|prometheus_client)==' requirements.txt)
	@touch $@

# 1) our gang launcher (Volcano's RestartJob in miniature): rank 1 dies at step 25, the gang resumes from step 20;
# 2) torchrun on its own rendezvous (the runtime joins it through env://).
train-demo: $(TORCH_VENV)/.installed
	rm -rf $(STATE)/train-demo
	PYTHONPATH=$(CURDIR) CHECKPOINT_DIR=$(STATE)/train-demo/gang CHECKPOINT_INTERVAL_STEPS=10 \
		$(TORCH_VENV)/bin/python -m training_runtime.gang --workers 2 --max-restarts 1 -- \
		$(TORCH_VENV)/bin/python -m training_runtime.examples.torch_trainer --steps 40 --crash-rank 1 --crash-at-step 25
	PYTHONPATH=$(CURDIR) CHECKPOINT_DIR=$(STATE)/train-demo/torchrun CHECKPOINT_INTERVAL_STEPS=10 \
		$(TORCH_VENV)/bin/python -m torch.distributed.run --standalone --nproc-per-node=2 -m training_runtime.examples.torch_trainer --steps 20

# The runtime is typed like the rest: `make lint` (and so `make test`) checks it too.
lint: training-lint
training-lint: venv
	.venv/bin/mypy training_runtime
