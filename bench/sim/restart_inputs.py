"""What the local cluster's end-to-end runs and the scale runs wrote about a gang's restart, read as outside input.

Parsing is defensive: a missing file, unreadable text, JSON that is not an object, a value that is not a finite
non-negative number, or phases out of order leave the affected term of ``bench.sim.restart`` on its fallback with a
note naming the file and the key.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
PHASES_FILE = ROOT / ".state" / "localcluster" / "e2e-phases.json"
REALNODES_FILE = ROOT / ".state" / "localcluster" / "e2e-realnodes.json"
#: tests/test_e2e_stack_in_pods.py: the guard's loop with real processes (its ``guard_fault_loop`` object).
IN_PODS_FILE = ROOT / ".state" / "localcluster" / "e2e-stack-in-pods.json"
GUARD_LOOP_KEY = "guard_fault_loop"
#: ``make bench-scale``: a fatal fault under a running gang at 256-2,048 pods (``tools/localcluster/scalecrash.py``),
#: per shape ``crash`` → gang size → ``evict_s`` / ``reschedule_s`` percentiles.
SCALE_FILE = ROOT / ".state" / "scale" / "results.json"
#: The same loop for a fatal fault: the rank dies with its GPU and the gang takes the crash path.
GUARD_FATAL_LOOP_KEY = "guard_fatal_loop"

#: Keys of tests/test_e2e.py's fault scenario, seconds from the fault.
QUARANTINE_KEY = "fault_time_to_quarantine_s"
EVICTED_KEY = "fault_time_to_training_evicted_s"
RESTARTED_KEY = "fault_time_to_gang_restarted_s"
#: The end-to-end figure the real-process fault loop reports (fault → first training step after resume).
FIRST_STEP_KEY = "fault_to_first_step_s"
PHASE_KEYS = (QUARANTINE_KEY, EVICTED_KEY, RESTARTED_KEY, FIRST_STEP_KEY)
#: tests/test_e2e_realnodes.py: the agents' pods Ready on a real kubelet, image cached (imagePullPolicy Never).
POD_START_KEY = "agents_ready_s"
#: The fault scenario's gang: 4 workers, one pod each (tests/test_e2e.py, e2e-fault-gang).
LOCAL_GANG_PODS = 4
#: The fault scenario's detection path: Prometheus scrapes every 1 s, the guard polls every 1 s and the fake
#: exporter has no sampling interval (tests/test_e2e.py); the stack's own path replaces it at scale.
LOCAL_DETECT_PATH_S = 2.0
#: A figure above this is not a restart phase of the local cluster (seconds): refused as bad input.
MAX_PHASE_S = 86_400.0

#: tests/test_e2e_stack_in_pods.py's researcher gang (``real_gang``): a worker killed under its supervisor.
REAL_GANG_KEY = "real_gang"
IN_PLACE_FIRST_STEP_KEY = "inplace_fault_to_first_step_s"
@dataclass(frozen=True)
class Measurements:
    """What the local cluster's end-to-end runs wrote, already checked; None where a figure is absent or bad."""

    detect_s: float | None = None
    evict_s: float | None = None
    reschedule_s: float | None = None
    pod_start_s: float | None = None
    fault_to_first_step_s: float | None = None
    #: Fault to first step when the fault is fatal (the crash path, ``guard_fatal_loop``).
    fatal_fault_to_first_step_s: float | None = None
    #: A worker killed under its supervisor to the gang's first step after the restart in place (``real_gang``).
    inplace_fault_to_first_step_s: float | None = None
    #: Eviction and rescheduling at scale (pods, evict_s, reschedule_s), medians, by pods; empty when not run.
    at_scale: tuple[tuple[int, float, float], ...] = ()
    #: Why each absent figure is absent, naming the file and the key.
    notes: tuple[str, ...] = ()
    phases_file: str = ""
    realnodes_file: str = ""
    scale_file: str = ""

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.detect_s, self.evict_s, self.reschedule_s, self.pod_start_s))


def _load_object(path: Path) -> tuple[dict[str, Any] | None, str]:
    """The file's JSON object, or None and why not."""
    if not path.is_file():
        return None, f"{path.name}: absent (run `make e2e`)"
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"{path.name}: unreadable ({type(exc).__name__})"
    except (json.JSONDecodeError, RecursionError) as exc:
        return None, f"{path.name}: not JSON ({type(exc).__name__})"
    if not isinstance(loaded, dict):
        return None, f"{path.name}: not a JSON object ({type(loaded).__name__})"
    return loaded, ""


def _seconds(data: dict[str, Any], key: str, file: str) -> tuple[float | None, str]:
    """``data[key]`` as a finite number of seconds in [0, MAX_PHASE_S], or None and a note naming file and key."""
    if key not in data:
        return None, f"{file}: key {key} absent"
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None, f"{file}: key {key} is not a number ({type(value).__name__})"
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_PHASE_S:
        return None, f"{file}: key {key} = {value!r} is not a phase in seconds (0 to {MAX_PHASE_S:g})"
    return seconds, ""


def _loop_first_step(pods: dict[str, Any], key: str, file: str, notes: list[str],
                     figure: str = FIRST_STEP_KEY) -> float | None:
    """A loop's fault to first step from the real-process file, or None with a note naming file and key."""
    loop = pods.get(key)
    if not isinstance(loop, dict):
        notes.append(f"{file}: key {key} is not an object of phases")
        return None
    seconds, why = _seconds(loop, figure, f"{file} {key}")
    if why:
        notes.append(why)
    return seconds


def read_scale_crashes(path: Path, notes: list[str]) -> tuple[tuple[int, float, float], ...]:
    """(pods, evict_s, reschedule_s) medians of every shape's crash runs, by pods (a later shape's figure replaces
    an earlier one's at the same size); anything malformed is skipped with a note naming the shape and the size."""
    data, why = _load_object(path)
    if data is None:
        notes.append(why.replace("make e2e", "make bench-scale"))
        return ()
    shapes = data.get("shapes")
    if not isinstance(shapes, dict):
        notes.append(f"{path.name}: key shapes is not an object")
        return ()
    found: dict[int, tuple[float, float]] = {}
    for shape, entry in shapes.items():
        crash = entry.get("crash") if isinstance(entry, dict) else None
        if crash is None:
            continue
        if not isinstance(crash, dict):
            notes.append(f"{path.name}: shapes.{shape}.crash is not an object")
            continue
        for size, figures in crash.items():
            where = f"{path.name} shapes.{shape}.crash.{size}"
            if not (isinstance(size, str) and size.isdigit() and 0 < int(size) <= 100_000):
                notes.append(f"{where}: not a gang size")
                continue
            terms = []
            for key in ("evict_s", "reschedule_s"):
                stats = figures.get(key) if isinstance(figures, dict) else None
                value, why = _seconds(stats, "p50", f"{where}.{key}") if isinstance(stats, dict) else (
                    None, f"{where}: key {key} is not an object of percentiles")
                if why:
                    notes.append(why)
                terms.append(value)
            if terms[0] is not None and terms[1] is not None:
                found[int(size)] = (terms[0], terms[1])
    return tuple((p, e, r) for p, (e, r) in sorted(found.items()))


def at_scale(points: tuple[tuple[int, float, float], ...], n_pods: int) -> tuple[float, float, str]:
    """Eviction and rescheduling seconds at ``n_pods`` from the scale runs: the measured figure at that size (within
    1 %); else linear between the two measured sizes around it; below the smallest, that one scaled by pods; above
    the largest, along the line through the two largest (never below the largest's figures)."""
    if not points:
        raise ValueError("no scale measurement")
    exact = next((pt for pt in points if abs(pt[0] - n_pods) <= 0.01 * n_pods), None)
    if exact is not None:
        return exact[1], exact[2], f"measured at {exact[0]:,} pods"
    below = [pt for pt in points if pt[0] < n_pods]
    above = [pt for pt in points if pt[0] > n_pods]
    if not below or len(points) == 1:
        p, e, r = above[0] if not below else below[-1]
        return e * n_pods / p, r * n_pods / p, f"measured at {p:,} pods, scaled by pods"
    if above:
        lo, hi = below[-1], above[0]
    else:
        lo, hi = points[-2], points[-1]
    f = (n_pods - lo[0]) / (hi[0] - lo[0])
    evict = max(0.0, lo[1] + f * (hi[1] - lo[1]))
    resched = max(0.0, lo[2] + f * (hi[2] - lo[2]))
    if not above:  # past the largest measured size: at least what it took
        evict, resched = max(evict, hi[1]), max(resched, hi[2])
    how = "between" if lo[0] < n_pods < hi[0] else "along the line through"
    return evict, resched, f"{how} {lo[0]:,} and {hi[0]:,} pods measured"


def _between(start: float | None, end: float | None, start_key: str, end_key: str, term: str, file: str,
             notes: list[str]) -> float | None:
    """Seconds from one phase to the next, both measured and in order; else None (with a note when out of order)."""
    if start is None or end is None:
        return None
    if end < start:
        notes.append(f"{file}: key {end_key} ({end:g}) is before {start_key} ({start:g}): {term} not measured")
        return None
    return end - start


def read_measurements(phases: Path = PHASES_FILE, realnodes: Path = REALNODES_FILE,
                      in_pods: Path = IN_PODS_FILE, scale: Path = SCALE_FILE) -> Measurements:
    """The measured terms from the three files; never raises on their content (see the module docstring). The fault
    to the first step after resume comes from the guard's loop with real processes (``in_pods``) when it ran,
    else from the phases file."""
    notes: list[str] = []
    got: dict[str, float | None] = dict.fromkeys(PHASE_KEYS)
    data, why = _load_object(phases)
    if data is None:
        notes.append(why)
    else:
        for key in PHASE_KEYS:
            got[key], why = _seconds(data, key, phases.name)
            if why and key != FIRST_STEP_KEY:
                notes.append(why)
    quarantine, evicted, restarted = got[QUARANTINE_KEY], got[EVICTED_KEY], got[RESTARTED_KEY]
    evict_s = _between(quarantine, evicted, QUARANTINE_KEY, EVICTED_KEY, "eviction", phases.name, notes)
    reschedule_s = _between(evicted, restarted, EVICTED_KEY, RESTARTED_KEY, "rescheduling", phases.name, notes)
    pod_start_s = None
    real, why = _load_object(realnodes)
    if real is None:
        notes.append(why)
    else:
        pod_start_s, why = _seconds(real, POD_START_KEY, realnodes.name)
        if why:
            notes.append(why)
    first_step = got[FIRST_STEP_KEY]
    pods, why = _load_object(in_pods)
    fatal_first_step = inplace_first_step = None
    if pods is None:
        notes.append(why)
    else:
        measured = _loop_first_step(pods, GUARD_LOOP_KEY, in_pods.name, notes)
        first_step = measured if measured is not None else first_step
        fatal_first_step = _loop_first_step(pods, GUARD_FATAL_LOOP_KEY, in_pods.name, notes)
        inplace_first_step = _loop_first_step(pods, REAL_GANG_KEY, in_pods.name, notes, IN_PLACE_FIRST_STEP_KEY)
    crashes = read_scale_crashes(scale, notes)
    return Measurements(detect_s=quarantine, evict_s=evict_s, reschedule_s=reschedule_s, pod_start_s=pod_start_s,
                        fault_to_first_step_s=first_step, fatal_fault_to_first_step_s=fatal_first_step,
                        inplace_fault_to_first_step_s=inplace_first_step,
                        at_scale=crashes, notes=tuple(notes),
                        phases_file=phases.name, realnodes_file=realnodes.name, scale_file=scale.name)
