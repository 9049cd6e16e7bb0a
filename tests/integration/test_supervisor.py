"""The process supervisor behind ``dlb up``/``dlb demo``: restarts, ordered stop, no orphans.

Children are plain ``sleep``/``python -c`` processes, so each rule is checked without Envoy and fast.
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from bounded_wait import until

from dlb.launch.supervisor import Child, StartError, Supervisor, processes_of_run


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _wait(cond, timeout: float = 10.0) -> bool:
    """Whether ``cond`` held within ``timeout`` (the callers assert it with their own message)."""
    try:
        until(cond, "the supervisor's children", timeout)
    except AssertionError:
        return False
    return True


def test_crashed_child_is_restarted_with_backoff_and_reported(tmp_path: Path) -> None:
    out = io.StringIO()
    sup = Supervisor(tmp_path, console=out)
    c = sup.add(Child("crasher", "t", [sys.executable, "-c", "import time,sys; time.sleep(0.2); sys.exit(3)"], tmp_path / "c.log"))
    sup.start(10)
    assert _wait(lambda: (sup.poll(), c.restarts >= 2)[1], 15)
    sup.stop(3)
    text = out.getvalue()
    assert "crasher: exited with 3; restarting in 0.5s" in text
    assert "crasher: exited with 3; restarting in 1.0s" in text  # the backoff doubled
    assert "restarted (pid" in text


def test_stop_goes_in_reverse_tier_order_and_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path, console=io.StringIO())
    sup.add(Child("cp", "control-plane", ["sleep", "60"], tmp_path / "cp.log"))
    sup.add(Child("leaf", "leaves", ["sleep", "60"], tmp_path / "leaf.log"))
    armed = tmp_path / "armed"  # written once SIGTERM is ignored: a SIGTERM before that would simply stop it
    stubborn = sup.add(Child("root", "roots", [sys.executable, "-c",
                                               "import pathlib,signal,sys,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                               "pathlib.Path(sys.argv[1]).touch(); time.sleep(60)", str(armed)],
                             tmp_path / "root.log", ready=armed.exists))
    sup.start(30)
    t0 = time.monotonic()
    sup.stop(budget_s=3.0)
    assert time.monotonic() - t0 < 4.0
    order = [who for _t, who, what in sup.events if what.startswith(("stopped", "killed"))]
    assert order == ["root", "leaf", "cp"]
    assert any(who == "root" and what.startswith("killed") for _t, who, what in sup.events)
    assert not _alive(stubborn.pid or 0)
    assert processes_of_run(tmp_path) == []


def test_a_child_that_is_not_ready_says_what_it_waits_for_then_the_timeout_names_it(tmp_path: Path) -> None:
    """``dlb up`` used to stay silent while a root waited for a dead cell, then name only the child."""
    out = io.StringIO()
    sup = Supervisor(tmp_path, console=out, wait_report_s=0.2)
    sup.add(Child("root", "roots", ["sleep", "60"], tmp_path / "root.log", ready=lambda: False,
                  waiting=lambda: "a leaf to answer"))
    sup.add(Child("quiet", "roots", ["sleep", "60"], tmp_path / "quiet.log", ready=lambda: False))
    try:
        with pytest.raises(StartError) as err:
            sup.start(1.0)
    finally:
        sup.stop(3)
    text = out.getvalue()
    assert re.search(r"root: not ready after \d+s: waiting for a leaf to answer\n", text), text
    assert re.search(r"quiet: not ready after \d+s\n", text), text  # no description: how long, at least
    assert "root (waiting for a leaf to answer)" in str(err.value) and "quiet" in str(err.value)


def test_a_description_that_raises_does_not_stop_the_start(tmp_path: Path) -> None:
    out = io.StringIO()
    sup = Supervisor(tmp_path, console=out, wait_report_s=0.0)
    sup.add(Child("c", "t", ["sleep", "60"], tmp_path / "c.log", ready=lambda: False, waiting=lambda: str(1 / 0)))
    try:
        with pytest.raises(StartError):
            sup.start(0.3)
    finally:
        sup.stop(3)
    assert "waiting for ? (ZeroDivisionError" in out.getvalue()


SUPERVISOR_SCRIPT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from dlb.launch.supervisor import Child, Supervisor
    sup = Supervisor(Path(sys.argv[1]))
    sup.add(Child("a", "t", ["sleep", "120"], Path(sys.argv[1]) / "a.log"))
    sup.add(Child("b", "t", [sys.executable, "-c", "import time; time.sleep(120)"], Path(sys.argv[1]) / "b.log"))
    sup.start(10)
    print(" ".join(map(str, sup.pids())), flush=True)
    time.sleep(120)
""")


def test_no_child_survives_a_sigkilled_supervisor(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISOR_SCRIPT, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ), start_new_session=True)
    try:
        assert proc.stdout is not None
        line = ""
        for line in proc.stdout:
            if line.strip() and line.split()[0].isdigit():
                break
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        # The children are in their own sessions: only the parent-death signal can reach them.
        assert all(os.getsid(p) == p for p in pids)
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
        assert _wait(lambda: not any(_alive(p) for p in pids), 10), "a child outlived its SIGKILLed supervisor"
        assert processes_of_run(tmp_path) == []
    finally:
        proc.kill()
        for p in processes_of_run(tmp_path):
            os.kill(p, signal.SIGKILL)


def test_cli_help_and_up_import_nothing_heavy() -> None:
    code = textwrap.dedent("""
        import sys
        from dlb import cli
        for argv in (["--help"], ["up", "--help"]):
            try:
                cli.main(argv)
            except SystemExit:
                pass
        heavy = sorted(m for m in ("scipy", "grpc", "dlb.xds.server", "dlb.sim.engine", "matplotlib") if m in sys.modules)
        print("HEAVY=" + ",".join(heavy))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    out = [line for line in out.splitlines() if line.startswith("HEAVY=")][-1].removeprefix("HEAVY=")
    assert out == "", f"building the parser for `dlb up` imported {out}"


def test_a_child_exiting_with_an_error_says_its_last_log_line_on_the_console(tmp_path: Path) -> None:
    """A config broken after ``dlb up`` started fails every restart of a crashed child: the console said only
    ``exited with 1`` while the reason sat in the child's log. What a previous run wrote is not this run's reason."""
    out = io.StringIO()
    sup = Supervisor(tmp_path, console=out)
    log = tmp_path / "c.log"
    log.write_text("an old run's last words\n")
    script = ("import pathlib,sys,time; time.sleep(0.2); runs = pathlib.Path(sys.argv[1]); n = len(runs.read_text()) if runs.exists() else 0; "
              "runs.write_text('x' * (n + 1)); print('dlb: 1 problem in config:'); "
              "print(f'dlb.yaml:57: endpoints[1].policy.flow.kappa: must be a number (run {n})' if n < 1 else ''); sys.exit(1)")
    c = sup.add(Child("agent", "t", [sys.executable, "-c", script, str(tmp_path / "runs")], log))
    sup.start(10)
    assert _wait(lambda: (sup.poll(), c.restarts >= 2)[1], 15)
    sup.stop(3)
    text = out.getvalue()
    assert "agent: exited with 1 (dlb.yaml:57: endpoints[1].policy.flow.kappa: must be a number (run 0)); restarting in 0.5s" in text
    # The second run printed no reason after its header line: that line, not the first run's reason.
    assert "agent: exited with 1 (dlb: 1 problem in config:); restarting in 1.0s" in text
    assert "old run" not in text
