# Before the unit tests: the two Go builds (engine, local control plane) side by side. Each is optional
# (it says in one line when this machine cannot build it, or when its per-run budget ran out) and cached.
# From an empty Go cache on 2 cores they finished together in 29.5 min run side by side (engine 29m23s,
# local cluster 28m37s), so a cold `make test` is bounded by the larger budget (40 min), not their sum.
# With other work on the machine a cold pair took 36m16s (engine) and 36m53s (local cluster); on a fresh
# machine with the virtual-kubelet in the local cluster (517 s of it), 34m33s and 36m03s. Warm Go
# cache, stale stamp: 5 s (engine) and 44 s (local cluster); stamp current: under a second.
.PHONY: go-builds go-builds-optional

# Both, side by side, failing if either fails (what `make up` needs).
go-builds:
	@$(MAKE) --no-print-directory engine & engine=$$!; \
	  $(MAKE) --no-print-directory localcluster & local=$$!; \
	  wait $$engine; e=$$?; wait $$local; l=$$?; exit $$((e | l))

go-builds-optional:
	@$(MAKE) --no-print-directory engine-optional & engine=$$!; \
	  $(MAKE) --no-print-directory localcluster-optional & local=$$!; \
	  wait $$engine; e=$$?; wait $$local; l=$$?; exit $$((e | l))

unit: go-builds-optional
