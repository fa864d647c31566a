"""Issue 44: what a preemption and a dead rank cost, on the real CLI under torchrun.

For each W in WORLD_SIZES (default 2,4; gloo CPU ranks, one thread each), the thermos capture
($DISTSPLAT_DATA/thermos, or SCENE) at --data_factor DATA_FACTOR (8), `default` strategy, three runs:

  signal   torchrun ... --max_steps 100000 --save_steps 40 (a regular save, with its PLY, to time) and
           --save_every_minutes SAVE_MIN (interim saves, checkpoint only, to time), --log_every 1; after
           step STOP_AT (the log's step marker), SIGTERM to torchrun, as a scheduler sends it. Measured:
           seconds from the signal to torchrun's exit (what a grace period must cover, torchrun's
           shutdown included), the trainer's own line (signal to checkpoint complete on rank 0), the
           steps between the last logged step and the step the ranks stopped at, the checkpoint's bytes;
           and from rank 0's per-step log timestamps how long a step with a save takes beyond the
           median step (regular with its PLY, interim).
  resume   the same command again: seconds from launch to its `resumed` line and to its first step;
           steps lost = the step it resumed at minus the step the signal's run stopped at (0).
  kill     the same command, fresh, under torchrun --max_restarts 1 with --save_every_minutes SAVE_MIN:
           rank 1 SIGKILLed after step KILL_AT; the restarted workers resume by themselves. Steps lost =
           the step rank 0 had logged minus the step the restart resumed at (at most the steps of one
           save interval); seconds from the kill to the restarted run's first step.

W ranks share the machine's cores (4 ranks on 2 cores: each step is slower than on 4 cores, the
signal path waits for the slowest rank's step). Writes preemption_<device>_<date>.json and prints one line.

    python benchmarks/studies/preemption/bench_preemption.py
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(REPO)]

from benchmarks.common import write_result  # noqa: E402
from benchmarks.paths import data_dir  # noqa: E402
from benchmarks.procs import worker_pids  # noqa: E402

STEP_LINE = re.compile(r"^(\S+ \S+) INFO distsplat\.train\.trainer: step (\d+)/\d+:", re.M)
STOP_LINE = re.compile(r"distsplat: preempted at step (\d+) by (\S+): checkpoint saved to (\S+) in ([\d.]+) s")


def command(W: int, result: Path, scene: str, factor: int, save_min: float, restarts: int = 0) -> List[str]:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={W}"]
    if restarts:
        launcher.append(f"--max_restarts={restarts}")
    return [*launcher, str(REPO / "examples" / "simple_trainer.py"), "default", "--data_dir", scene,
            "--data_factor", str(factor), "--max_steps", "100000", "--save_steps", "40", "--eval_steps", "100000",
            "--save_every_minutes", str(save_min), "--log_every", "1", "--disable_viewer", "--result_dir", str(result)]


def start(cmd: List[str], log: Path) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    with open(log, "w") as f:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(log: Path, pattern: str, proc: subprocess.Popen, timeout: float = 900, after: int = 0) -> re.Match:
    """The first match of `pattern` in the log past offset `after` (a later attempt's lines)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.compile(pattern, re.M).search(log.read_text(), after)
        if found:
            return found
        if proc.poll() is not None:
            raise RuntimeError(f"exited {proc.returncode} before {pattern!r}:\n{log.read_text()[-3000:]}")
        time.sleep(0.01)
    raise RuntimeError(f"no {pattern!r} within {timeout} s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    """torchrun and its workers (each in a session of its own: killing torchrun's leaves them running)."""
    if proc.poll() is None:
        for pid in worker_pids(proc.pid).values():
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def step_times(text: str) -> Dict[int, float]:
    """{step: time rank 0 logged it} (seconds)."""
    return {int(s): datetime.strptime(t, "%Y-%m-%d %H:%M:%S,%f").timestamp() for t, s in STEP_LINE.findall(text)}


def stalls(text: str, regular: List[int], interim: List[int]) -> Dict[str, Any]:
    """Seconds a step that saved took beyond the median step (its step line to the next one)."""
    t = step_times(text)
    gaps = {s: t[s + 1] - t[s] for s in t if s + 1 in t and s > 3}  # past the first steps' warm-up
    plain = [g for s, g in gaps.items() if s not in regular and s not in interim]
    median = statistics.median(plain) if plain else None
    over = lambda steps: [round(gaps[s] - median, 3) for s in steps if s in gaps]  # noqa: E731
    return {"median_step_s": median and round(median, 3), "regular_save_with_ply_extra_s": over(regular),
            "interim_save_extra_s": over(interim)}


def worker_pid(agent: int, rank: int) -> int:
    found = worker_pids(agent)
    if rank not in found:
        raise RuntimeError(f"no rank {rank} under {agent}")
    return found[rank]


def interim_steps(text: str) -> List[int]:
    """The steps rank 0 said it saved an interim (--save_every_minutes) checkpoint at."""
    return [int(s) for s in re.findall(r"step (\d+): interim checkpoint saved", text)]


def measure(W: int, scene: str, factor: int, stop_at: int, kill_at: int, save_min: float, work: Path) -> Dict:
    from distsplat.train.files import checkpoint as ck

    out: Dict[str, Any] = {"W": W}
    result, log = work / f"w{W}", work / f"w{W}_signal.log"
    t0 = time.monotonic()
    proc = start(command(W, result, scene, factor, save_min), log)
    try:
        wait_for(log, rf"step {stop_at}/", proc)
        at_signal = max(step_times(log.read_text()))
        t_signal = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(600)
        t_exit = time.monotonic()
    finally:
        stop(proc)
    text = log.read_text()
    found = STOP_LINE.search(text)
    if not found:
        raise RuntimeError(f"no preempted line:\n{text[-3000:]}")
    stopped, ckpt = int(found[1]), Path(found[3])
    saves = [ck._step_of(p) for p in ck.complete_checkpoints(result / "ckpts")]
    out["signal"] = {
        "launch_to_signal_s": round(t_signal - t0, 1), "last_step_logged_at_signal": at_signal,
        "stopped_at_step": stopped, "steps_after_signal": stopped - at_signal,
        "signal_to_checkpoint_complete_s_rank0": float(found[4]), "signal_to_exit_s": round(t_exit - t_signal, 2),
        "torchrun_exit_code": code, "checkpoint_bytes": sum(f.stat().st_size for f in ckpt.iterdir()),
        "checkpoints_left": saves,
        "interim_saves_at": interim_steps(text),
        "save_stalls": stalls(text, regular=[40], interim=interim_steps(text)),
    }
    # resume: the same command
    log = work / f"w{W}_resume.log"
    t0 = time.monotonic()
    proc = start(command(W, result, scene, factor, save_min), log)
    try:
        m = wait_for(log, r"resumed \S+step_(\d+): step (\d+),", proc)
        resumed = int(m[2])
        t_resumed = time.monotonic()
        wait_for(log, rf"step {resumed + 1}/", proc, after=m.end())
        t_first = time.monotonic()
    finally:
        stop(proc)
    out["resume"] = {"launch_to_resumed_s": round(t_resumed - t0, 1), "launch_to_first_step_s": round(t_first - t0, 1),
                     "resumed_at_step": resumed, "steps_lost": stopped - resumed}
    # kill: a fresh run, rank 1 SIGKILLed; torchrun restarts the workers, which resume by themselves
    result, log = work / f"w{W}_kill", work / f"w{W}_kill.log"
    proc = start(command(W, result, scene, factor, save_min, restarts=1), log)
    try:
        wait_for(log, rf"step {kill_at}/", proc)
        logged = max(step_times(log.read_text()))
        interim = [ck._step_of(p) for p in ck.complete_checkpoints(result / "ckpts")]
        os.kill(worker_pid(proc.pid, 1), signal.SIGKILL)
        t_kill = time.monotonic()
        m = wait_for(log, r"resumed \S+step_(\d+): step (\d+),", proc)
        back = int(m[2])
        wait_for(log, rf"step {back + 1}/", proc, after=m.end())
        t_back = time.monotonic()
    finally:
        stop(proc)
    text = log.read_text()
    first_attempt = text.split("resumed ")[0]
    out["kill"] = {"last_step_logged_at_kill": logged, "checkpoints_at_kill": interim, "resumed_at_step": back,
                   "steps_lost": logged - back, "kill_to_first_step_after_restart_s": round(t_back - t_kill, 1),
                   "save_stalls": stalls(first_attempt, regular=[40], interim=interim_steps(first_attempt))}
    return out


def main() -> None:
    scene = os.environ.get("SCENE", str(data_dir() / "thermos"))
    factor = int(os.environ.get("DATA_FACTOR", 8))
    sizes = [int(w) for w in os.environ.get("WORLD_SIZES", "2,4").split(",")]
    stop_at, kill_at = int(os.environ.get("STOP_AT", 60)), int(os.environ.get("KILL_AT", 70))
    save_min = float(os.environ.get("SAVE_MIN", 0.25))
    runs = []
    with tempfile.TemporaryDirectory(prefix="distsplat-preempt-") as d:
        for W in sizes:
            r = measure(W, scene, factor, stop_at, kill_at, save_min, Path(d))
            print(W, r, flush=True)
            runs.append(r)
    note = (f"The real CLI under torchrun (--standalone, gloo CPU ranks, 1 thread each) on {Path(scene).name} at "
            f"--data_factor {factor}, default strategy, --save_steps 40, --save_every_minutes {save_min}, "
            f"--log_every 1. signal: SIGTERM to torchrun after rank 0 logged step {stop_at}; signal_to_exit_s is "
            "what a scheduler's grace period must cover (torchrun forwards the signal, the ranks finish their step, "
            "agree, save, exit, torchrun exits); signal_to_checkpoint_complete_s_rank0 is the trainer's own line. "
            "resume: the same command, steps_lost = stopped - resumed. kill: a fresh run under --max_restarts 1, "
            f"rank 1 SIGKILLed after rank 0 logged step {kill_at}; steps_lost = last step logged - step resumed "
            "(bounded by the save interval: --save_steps or --save_every_minutes). save_stalls: from rank 0's step "
            "log timestamps, a save step's time beyond the median step (regular: checkpoint + PLY at step 40; "
            "interim: checkpoint only). W ranks share the machine's cores (4 ranks on 2 cores).")
    path = write_result("preemption", {"scene": Path(scene).name, "data_factor": factor, "note": note, "runs": runs})
    print("preemption: " + "; ".join(
        f"W={r['W']} signal->exit {r['signal']['signal_to_exit_s']} s (saved in "
        f"{r['signal']['signal_to_checkpoint_complete_s_rank0']} s), steps lost: signal {r['resume']['steps_lost']}, "
        f"kill {r['kill']['steps_lost']}" for r in runs) + f" -> {path}")


if __name__ == "__main__":
    main()
