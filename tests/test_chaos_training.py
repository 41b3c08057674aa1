"""The soak's training gang, judged from its ranks' event lines: what each restart cost, whether a checkpoint was
lost, which fault a restart follows and whether that fault may cost steps at all (tools/chaos/training.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tools.chaos.schedule import TRAINING_FAULTS, Fault, schedule
from tools.chaos.training import (
    INTERVAL,
    STEP_BOUND,
    EventTail,
    GangHistory,
    Restart,
    gang_spec,
    judge,
    read_events,
)


def ev(event: str, rank: int, t: float, step: int, inplace: int = 0, **more: Any) -> dict[str, Any]:
    return {"event": event, "rank": rank, "t": t, "step": step, "inplace": inplace, "attempt": 0, **more}


def trained(rounds: list[tuple[int, int, int]], ranks: int = 2, durable_lag: int = 0) -> list[dict[str, Any]]:
    """Events of a gang whose round r resumes at ``resume`` and steps to ``reach`` (one second a step, every rank),
    making each INTERVAL-th step durable ``durable_lag`` steps later: ``rounds`` = [(round, resume, reach)]."""
    out: list[dict[str, Any]] = []
    t = 0.0
    for r, resume, reach in rounds:
        t += 1
        out += [ev("resume", k, t, resume, r) for k in range(ranks)]
        for step in range(resume + 1, reach + 1):
            t += 1
            out += [ev("step", k, t, step, r) for k in range(ranks)]
            done = step - durable_lag
            if done > resume and done % INTERVAL == 0:
                out += [ev("durable", k, t, done, r, at_step=step) for k in range(ranks)]
    return out


def history(events: list[dict[str, Any]]) -> GangHistory:
    h = GangHistory()
    h.add(events)
    return h


def test_a_restart_costs_the_steps_past_the_checkpoint_it_resumed_from() -> None:
    h = history(trained([(0, 0, 35), (1, 30, 50)]))
    (restart,) = h.restarts()
    assert (restart.round, restart.reached, restart.resumed, restart.lost) == (1, 35, 30, 5)
    assert h.checkpoints_lost() == []
    assert h.complete_checkpoint_before(restart.at) == 30


def test_a_round_that_never_stepped_redoes_nothing_more() -> None:
    events = [*trained([(0, 0, 35)]), ev("resume", 0, 100, 30, 1), *trained([(2, 30, 40)])]
    for e in events[-42:]:
        e["t"] += 200
    restarts = history(events).restarts()
    assert [(r.round, r.lost) for r in restarts] == [(1, 5)], restarts


def test_resuming_below_the_newest_complete_checkpoint_is_a_checkpoint_lost() -> None:
    h = history(trained([(0, 0, 35), (1, 20, 40)]))
    assert h.checkpoints_lost() == ["round 1 resumed at step 20, below the complete checkpoint of step 30"]


def test_a_checkpoint_is_complete_only_once_every_rank_made_it_durable() -> None:
    events = trained([(0, 0, 35)])
    # Rank 1 never made step 30 durable: the newest complete checkpoint is 20, and resuming there loses nothing.
    events = [e for e in events if not (e["event"] == "durable" and e["rank"] == 1 and e["step"] == 30)]
    events += [ev("resume", k, 1000, 20, 1) for k in range(2)] + [ev("step", k, 1001, 21, 1) for k in range(2)]
    h = history(events)
    assert h.complete_checkpoint_before(999) == 20
    assert h.checkpoints_lost() == []


def test_the_gang_trains_only_when_every_rank_of_its_newest_round_stepped_lately() -> None:
    h = history(trained([(0, 0, 5)]))
    assert h.training(workers=2, now=12, stalled_after_s=30)
    assert not h.training(workers=2, now=100, stalled_after_s=30)  # stalled
    assert not h.training(workers=3, now=12, stalled_after_s=30)  # a rank never stepped
    h.add([ev("resume", 0, 13, 5, 1)])  # a new round that has only resumed: the old one is over
    assert not h.training(workers=2, now=13.5, stalled_after_s=30)
    h.add([ev("step", 0, 14, 6, 1)])  # one rank of the new round stepped so far
    assert not h.training(workers=2, now=15, stalled_after_s=30)


INJECTED_AT = 36.5  # between round 0's last step and round 1's resume in trained([(0, 0, 35), (1, ...)])


def test_judge_charges_each_restart_to_the_fault_before_it_against_its_bound() -> None:
    within = judge(history(trained([(0, 0, 35), (1, 30, 50)])), [(INJECTED_AT, Fault.TRAINER_KILLED, "1")])
    assert within["violations"] == {"training-restarted-by-another-fault": 0, "training-steps-over-bound": 0,
                                    "checkpoint-went-backward": 0}
    assert within["training_steps_lost"] == 5 and within["training_restarts_by_fault"] == {"trainer-killed": 1}
    assert within["training_step_reached"] == 50
    # A graceful eviction checkpoints on SIGTERM: 5 steps redone are over its bound of 0.
    evicted = judge(history(trained([(0, 0, 35), (1, 30, 50)])), [(INJECTED_AT, Fault.TRAINER_EVICTED, "0")])
    assert evicted["violations"]["training-steps-over-bound"] == 1
    assert evicted["details"] == ["trainer-evicted on 0: 5 steps lost, bound 0"]
    # A leader change must not restart training at all.
    other = judge(history(trained([(0, 0, 35), (1, 30, 50)])), [(INJECTED_AT, Fault.LEADER_KILLED, "node-pools")])
    assert other["violations"]["training-restarted-by-another-fault"] == 1
    assert other["details"] == ["round 1 restarted after leader-killed node-pools: a fault that must not restart "
                                "training (5 steps lost)"]
    # The latest fault before the resume is the cause; one before it is not.
    later = judge(history(trained([(0, 0, 35), (1, 30, 50)])),
                  [(1.0, Fault.LEADER_KILLED, "node-pools"), (INJECTED_AT, Fault.TRAINER_POD_KILLED, "1")])
    assert later["training_restarts_by_fault"] == {"trainer-pod-killed": 1}
    assert sum(later["violations"].values()) == 0


def test_a_restart_slower_than_the_next_fault_is_charged_to_the_fault_that_broke_its_round() -> None:
    """A whole-gang restart through Volcano can outlast the period between faults: the fault put in place while the
    gang was between rounds did not restart it (the 2-hour soak blamed api-latency and a scheduler restart for two
    trainer-pod-killed restarts that took longer than 30 s)."""
    events = trained([(0, 0, 35), (1, 30, 50)])  # round 0 began at t=1 and stepped to t=36; round 1 resumed at t=37
    slow = judge(history(events), [(20.0, Fault.TRAINER_POD_KILLED, "1"), (36.5, Fault.API_LATENCY, "apiproxy")])
    assert slow["training_restarts_by_fault"] == {"trainer-pod-killed": 1} and sum(slow["violations"].values()) == 0
    # Each restart and what it was charged to stay in the report: the run can be judged again without its volume.
    assert slow["training_restarts"] == [{"round": 1, "resumed_at": 37.0, "lost": 5, "broken_round_began_at": 1.0,
                                          "charged_to": [20.0, "trainer-pod-killed", "1"]}]
    # A fault put in place before the broken round began did not break it: what came during that round is named.
    early = judge(history(events), [(0.5, Fault.TRAINER_KILLED, "0"), (20.0, Fault.LEADER_KILLED, "node-pools")])
    assert early["violations"]["training-restarted-by-another-fault"] == 1
    assert early["training_restarts_by_fault"] == {"leader-killed": 1}


@given(crashes=st.lists(st.integers(1, 60), min_size=1, max_size=6), lag=st.integers(0, INTERVAL))
def test_a_trainer_that_resumes_from_its_newest_complete_checkpoint_is_never_charged_more_than_two_intervals(
        crashes: list[int], lag: int) -> None:
    """Async checkpoints lag up to one interval: a crash anywhere costs at most two intervals, and resuming from
    the newest complete checkpoint is never a checkpoint lost."""
    rounds: list[tuple[int, int, int]] = []
    resume = 0
    for r, ahead in enumerate(crashes):
        reach = resume + ahead
        rounds.append((r, resume, reach))
        durable = [s for s in range(resume + 1, reach + 1) if s % INTERVAL == 0 and s + lag <= reach]
        resume = max(durable, default=resume)
    h = history(trained(rounds, durable_lag=lag))
    assert h.checkpoints_lost() == []
    assert all(0 <= r.lost <= 2 * INTERVAL for r in h.restarts()), h.restarts()
    assert len(h.restarts()) == len(crashes) - 1


@given(st.integers(1, 9))
def test_resuming_any_step_below_the_complete_checkpoint_is_always_named(below: int) -> None:
    h = history(trained([(0, 0, 45), (1, 40 - below, 50)]))
    assert len(h.checkpoints_lost()) == 1


def test_the_event_tail_reads_each_complete_line_once_and_skips_torn_ones(tmp_path: Path) -> None:
    folder = tmp_path / "pvc-1" / "soak-gang"
    folder.mkdir(parents=True)
    rank0 = folder / "events.rank-0"
    rank0.write_text(json.dumps(ev("resume", 0, 1, 0)) + "\n" + '{"event": "st')
    tail = EventTail(tmp_path, "soak-gang")
    assert [e["event"] for e in tail.read()] == ["resume"]
    with rank0.open("a") as f:
        f.write('ep", "step": 1, "t": 2}\nnot json\n')
    (folder / "events.rank-1").write_text(json.dumps(ev("resume", 1, 1, 0)) + "\n")
    read = tail.read()
    assert [(e["event"], e["rank"]) for e in read] == [("step", 0), ("resume", 1)]
    assert tail.read() == []
    assert [e["event"] for e in read_events(tmp_path, "soak-gang") if e["rank"] == 1] == ["resume"]


def test_the_training_faults_hit_ranks_only_when_a_gang_trains() -> None:
    plan = schedule(3, 7200, 30, ("a",), ("vk",), ("n",), ranks=("0", "1"))
    hits = [i for i in plan if i.fault in TRAINING_FAULTS]
    assert hits and {i.target for i in hits} == {"0", "1"}
    assert not [i for i in schedule(3, 7200, 30, ("a",), ("vk",), ("n",)) if i.fault in TRAINING_FAULTS]
    assert set(TRAINING_FAULTS) <= set(STEP_BOUND)


def test_the_gang_spec_is_what_the_cli_takes() -> None:
    spec = gang_spec("g", "img:1", 100, 2, 2, "real-gpu")
    assert spec["gpus"] == {"nodes": 2, "gpusPerNode": 2} and spec["checkpointInterval"] == INTERVAL
    assert "$(CHECKPOINT_DIR)/events" in spec["command"]
    assert isinstance(Restart(1, 0.0, 10, 12).lost, int) and Restart(1, 0.0, 10, 12).lost == 0


def test_the_soaks_gang_spec_is_one_the_cli_accepts() -> None:
    """The spec goes through `gpucluster train submit`: the CLI's own model must take it as it is."""
    from gpucluster_cli.spec import parse_spec

    spec = gang_spec("soak-gang", "docker.io/local/training-runtime:0.1.0", 30000, 2, 2, "real-gpu")
    parsed = parse_spec(json.dumps(spec), "soak-gang.json")
    assert parsed.max_retries == spec["maxRetries"] == 100
