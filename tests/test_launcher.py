"""procgroup-run: real launcher processes starting real rank processes.

Each test starts one launcher (a few ranks that are tiny Python scripts) and checks many
things in that one run; scripts are written into tmp_path. "Within seconds" is shown
structurally: the ranks sleep far longer than the subprocess safety timeout, so the
launcher can only return in time if it stopped them.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _installed import require_mpi

pytestmark = pytest.mark.timeout(240)

SAFETY = 120  # subprocess safety timeout (s); the sleeping ranks sleep 600 s
ENV_KEYS = [
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "MASTER_ADDR", "MASTER_PORT", "PROCGROUP_BACKEND", "PROCGROUP_RESTART_COUNT",
    "PROCGROUP_ERROR_FILE", "PYTHONUNBUFFERED",
]


def launcher_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "procgroup.run", *args]


def launch(*args: str, cwd: Path | None = None, timeout: float = SAFETY) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        launcher_cmd(*args), capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False
    )


def write(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source))
    return path


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (an orphan's zombie may linger)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_for_files(paths: list[Path], proc: subprocess.Popen[str], limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while not all(p.exists() for p in paths):
        if proc.poll() is not None:
            raise RuntimeError(f"launcher exited early: {proc.communicate()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"ranks did not start: missing {[p for p in paths if not p.exists()]}")
        time.sleep(0.05)


# A rank that records its pid, waits until every rank of the node has, then does ACTION
# (chosen per rank through argv), else sleeps long.
WAITING_RANK = """
    import os, pathlib, signal, sys, time
    d = pathlib.Path(sys.argv[1])
    rank, local_size = int(os.environ["RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    actions = dict(a.split("=", 1) for a in sys.argv[2:])
    if actions.get(str(rank)) == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    (d / f"pid{rank}.tmp").write_text(str(os.getpid()))
    os.replace(d / f"pid{rank}.tmp", d / f"pid{rank}")
    deadline = time.monotonic() + 60
    while not all((d / f"pid{r}").exists() for r in range(local_size)):
        if time.monotonic() > deadline:
            sys.exit("peers did not start")
        time.sleep(0.02)
    action = actions.get(str(rank), "sleep")

    def fail_here():
        raise ValueError(f"boom from rank {rank}")

    if action == "raise":
        fail_here()
    elif action == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action.startswith("exit"):
        sys.exit(int(action[4:]))
    elif action == "ok":
        sys.exit(0)
    time.sleep(600)
"""


def pids(d: Path, n: int) -> list[int]:
    return [int((d / f"pid{r}").read_text()) for r in range(n)]


# ---------------------------------------------------------------------------- env, output


def test_env_prefix_logdir_and_script_path(tmp_path: Path) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    write(scripts / "helper_mod.py", "VALUE = 'helper-imported'\n")
    script = write(scripts / "show_env.py", f"""
        import json, os, sys
        import helper_mod  # next to the script: sys.path[0] must be the script's folder
        keys = {ENV_KEYS!r}
        print("ENV " + json.dumps({{k: os.environ.get(k) for k in keys}}))
        print("ARGV " + json.dumps(sys.argv[1:]) + " " + __name__ + " " + helper_mod.VALUE)
        print(f"out-line rank {{os.environ['RANK']}}")
        print(f"err-line rank {{os.environ['RANK']}}", file=sys.stderr)
        sys.stdout.write("no-newline-at-end")
    """)
    logs = tmp_path / "logs"
    res = launch("-n", "3", "--backend", "tcp", "--log-dir", str(logs),
                 str(script), "alpha", "--beta", "-n", "7", cwd=tmp_path)
    assert res.returncode == 0, res.stderr

    envs = {}
    for line in res.stdout.splitlines():
        m = re.fullmatch(r"\[rank(\d+)\]: ENV (.*)", line)
        if m:
            envs[int(m.group(1))] = json.loads(m.group(2))
    assert sorted(envs) == [0, 1, 2]
    ports = {e["MASTER_PORT"] for e in envs.values()}
    assert len(ports) == 1
    port = int(ports.pop())
    assert 1 <= port <= 65535
    for rank, e in envs.items():
        assert e["RANK"] == str(rank)
        assert e["LOCAL_RANK"] == str(rank)
        assert e["WORLD_SIZE"] == "3"
        assert e["LOCAL_WORLD_SIZE"] == "3"
        assert e["GROUP_RANK"] == "0"
        assert e["MASTER_ADDR"] == "127.0.0.1"
        assert e["PROCGROUP_BACKEND"] == "tcp"
        assert e["PROCGROUP_RESTART_COUNT"] == "0"
        assert e["PYTHONUNBUFFERED"] == "1"
        assert e["PROCGROUP_ERROR_FILE"] == str(logs / f"rank{rank}.error.json")
        # script args pass through untouched, even ones that look like launcher options
        assert f'[rank{rank}]: ARGV ["alpha", "--beta", "-n", "7"] __main__ helper-imported' in res.stdout

    for rank in range(3):
        assert f"[rank{rank}]: out-line rank {rank}" in res.stdout.splitlines()
        assert f"[rank{rank}]: err-line rank {rank}" in res.stderr.splitlines()
        assert f"err-line rank {rank}" not in res.stdout  # streams kept apart
        assert f"out-line rank {rank}" not in res.stderr
        assert f"[rank{rank}]: no-newline-at-end" in res.stdout.splitlines()
        out_log = (logs / f"rank{rank}.stdout.log").read_text()
        err_log = (logs / f"rank{rank}.stderr.log").read_text()
        assert f"out-line rank {rank}\n" in out_log and "[rank" not in out_log
        assert out_log.endswith("no-newline-at-end")
        assert err_log == f"err-line rank {rank}\n"
        assert not (logs / f"rank{rank}.error.json").exists()  # nobody failed

    # every output line is whole and prefixed (no interleaving inside a line)
    for line in res.stdout.splitlines():
        assert re.match(r"\[rank[0-2]\]: (ENV|ARGV|out-line|no-newline)", line), line


def test_no_prefix(tmp_path: Path) -> None:
    script = write(tmp_path / "hello.py", """
        import os, sys
        print("hello from", os.environ["RANK"])
        print("warn from", os.environ["RANK"], file=sys.stderr)
    """)
    res = launch("-n", "2", "--no-prefix", str(script))
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["hello from 0", "hello from 1"]
    assert sorted(res.stderr.splitlines()) == ["warn from 0", "warn from 1"]


def test_two_launchers_as_two_nodes(tmp_path: Path) -> None:
    script = write(tmp_path / "env.py", f"""
        import json, os
        print("ENV " + json.dumps({{k: os.environ.get(k) for k in {ENV_KEYS!r}}}))
    """)
    with socket.socket() as s:  # any port: these ranks never listen on it
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = [
        subprocess.Popen(
            launcher_cmd("--nnodes", "2", "--node-rank", str(node), "-n", "2",
                         "--master-port", port, str(script)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for node in (0, 1)
    ]
    outs = [p.communicate(timeout=SAFETY) for p in procs]
    envs = {}
    for node, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, err
        for line in out.splitlines():
            m = re.fullmatch(r"\[rank(\d+)\]: ENV (.*)", line)
            assert m, line
            e = json.loads(m.group(2))
            assert e["GROUP_RANK"] == str(node)
            envs[int(m.group(1))] = e
    assert sorted(envs) == [0, 1, 2, 3]
    for rank, e in envs.items():
        assert e["RANK"] == str(rank)
        assert e["LOCAL_RANK"] == str(rank % 2)
        assert e["GROUP_RANK"] == str(rank // 2)
        assert e["WORLD_SIZE"] == "4"
        assert e["LOCAL_WORLD_SIZE"] == "2"
        assert e["MASTER_PORT"] == port
        assert e["PROCGROUP_BACKEND"] is None  # no --backend given


def test_job_token_for_the_workers(tmp_path: Path) -> None:
    """A fresh token per single-node job, the same for all its ranks (and restarts); one
    given in PROCGROUP_JOB_TOKEN is passed on as it is (the way for multi-node jobs)."""
    import os

    script = write(tmp_path / "tok.py", """
        import os
        print("TOKEN", os.environ.get("PROCGROUP_JOB_TOKEN"))
    """)
    env = {k: v for k, v in os.environ.items() if k != "PROCGROUP_JOB_TOKEN"}

    def tokens(*args: str, extra: dict[str, str] | None = None) -> set[str]:
        res = subprocess.run(launcher_cmd(*args, str(script)), capture_output=True, text=True,
                             timeout=SAFETY, env={**env, **(extra or {})}, check=False)
        assert res.returncode == 0, res.stderr
        return {line.split()[-1] for line in res.stdout.splitlines() if "TOKEN" in line}

    first, second = tokens("-n", "3"), tokens("-n", "2")
    assert len(first) == 1 and len(second) == 1 and first != second
    assert len(first.pop()) >= 32 and "None" not in second
    assert tokens("-n", "2", extra={"PROCGROUP_JOB_TOKEN": "given-by-user"}) == {"given-by-user"}
    with socket.socket() as sock:  # any port: these ranks never listen on it
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    res = subprocess.run(launcher_cmd("--nnodes", "2", "--node-rank", "1", "--master-port", port, str(script)),
                         capture_output=True, text=True, timeout=SAFETY, env=env, check=False)
    assert "PROCGROUP_JOB_TOKEN" in res.stderr and "TOKEN None" in res.stdout  # warned, none invented


def test_module_mode(tmp_path: Path) -> None:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    write(pkg / "sibling.py", "NAME = 'sibling'\n")
    write(pkg / "main.py", """
        import json, os, sys
        from mypkg import sibling
        print("MOD " + json.dumps([__name__, os.path.basename(sys.argv[0]), sys.argv[1:],
                                   sibling.NAME, os.environ["RANK"]]))
    """)
    res = launch("-n", "2", "-m", "mypkg.main", "x", "--y", "-m", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    seen = sorted(json.loads(line.split("MOD ", 1)[1]) for line in res.stdout.splitlines())
    assert seen == [
        ["__main__", "main.py", ["x", "--y", "-m"], "sibling", "0"],
        ["__main__", "main.py", ["x", "--y", "-m"], "sibling", "1"],
    ]


def test_console_script(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("procgroup-run")  # installed with procgroup, next to python
    assert exe.exists(), f"the procgroup-run console script is missing next to {sys.executable}"
    script = write(tmp_path / "one.py", "import os; print('size', os.environ['WORLD_SIZE'])\n")
    res = subprocess.run([str(exe), "-n", "2", str(script)], capture_output=True, text=True,
                         timeout=SAFETY, check=False)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["[rank0]: size 2", "[rank1]: size 2"]


# ---------------------------------------------------------------------------- port


def test_free_port_is_held_and_reusable_by_rank0(tmp_path: Path) -> None:
    """Rank 0 serves on MASTER_PORT the way TCPStore does (SO_REUSEADDR) while the
    launcher holds it; a plain bind elsewhere is refused, so nobody can steal it."""
    script = write(tmp_path / "port.py", """
        import os, socket, sys, time
        rank, port = int(os.environ["RANK"]), int(os.environ["MASTER_PORT"])
        if rank == 0:
            # a plain bind (no SO_REUSEADDR) must fail: the launcher holds the port
            s = socket.socket()
            try:
                s.bind(("", port))
                print("PLAIN-BIND succeeded")
            except OSError as e:
                print("PLAIN-BIND refused", e.errno)
            s.close()
            srv = socket.create_server(("", port))  # sets SO_REUSEADDR, like TCPStore
            srv.settimeout(60)
            conn, _ = srv.accept()
            conn.settimeout(60)
            print("SERVED", conn.recv(100).decode())
        else:
            deadline = time.monotonic() + 60
            while True:
                try:
                    c = socket.create_connection((os.environ["MASTER_ADDR"], port), timeout=60)
                    break
                except ConnectionRefusedError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            c.sendall(b"hello-from-1")
            c.close()
    """)
    res = launch("-n", "2", str(script))
    assert res.returncode == 0, res.stderr
    assert "[rank0]: PLAIN-BIND refused 98" in res.stdout  # EADDRINUSE
    assert "[rank0]: SERVED hello-from-1" in res.stdout


# ---------------------------------------------------------------------------- failures


def test_crash_stops_others_and_prints_traceback_once(tmp_path: Path) -> None:
    script = write(tmp_path / "rank.py", WAITING_RANK)
    res = launch("-n", "3", "--grace-period", "2", str(script), str(tmp_path), "1=raise")
    assert res.returncode == 1, res.stderr
    err = res.stderr
    p = pids(tmp_path, 3)
    assert f"root cause: rank 1 (node 0, local rank 1, pid {p[1]}) exited with code 1" in err
    assert err.count("Traceback (most recent call last)") == 1
    assert err.count('raise ValueError(f"boom from rank {rank}")') == 1
    assert "[rank1]: ValueError: boom from rank 1" in err.splitlines()
    assert "in fail_here" in err
    assert "rankside" not in err and "runpy" not in err  # bootstrap frames trimmed
    for r in (0, 2):
        assert (f"rank {r} (node 0, local rank {r}, pid {p[r]}) was killed by SIGTERM "
                "(stopped by the launcher)") in err
    assert not any(pid_alive(x) for x in p)


def test_killed_rank_and_sigterm_ignoring_rank(tmp_path: Path) -> None:
    script = write(tmp_path / "rank.py", WAITING_RANK)
    res = launch("-n", "3", "--grace-period", "1", str(script), str(tmp_path),
                 "1=sigkill", "0=ignore-term")
    assert res.returncode == 128 + signal.SIGKILL, res.stderr
    p = pids(tmp_path, 3)
    assert f"root cause: rank 1 (node 0, local rank 1, pid {p[1]}) was killed by SIGKILL" in res.stderr
    # rank 0 ignored SIGTERM: SIGKILL after the grace period
    assert f"rank 0 (node 0, local rank 0, pid {p[0]}) was killed by SIGKILL (stopped by the launcher)" in res.stderr
    assert f"rank 2 (node 0, local rank 2, pid {p[2]}) was killed by SIGTERM (stopped by the launcher)" in res.stderr
    assert "Traceback" not in res.stderr
    assert not any(pid_alive(x) for x in p)


def test_timeout_kills_hanging_job(tmp_path: Path) -> None:
    script = write(tmp_path / "rank.py", WAITING_RANK)
    res = launch("-n", "2", "--timeout", "3", "--grace-period", "1", str(script), str(tmp_path),
                 "0=ok")
    assert res.returncode == 124, res.stderr
    assert "job timed out after 3 s (--timeout); ranks still running were stopped: [1]" in res.stderr
    assert "rank 1 (node 0, local rank 1" in res.stderr and "stopped by the launcher" in res.stderr
    assert not any(pid_alive(x) for x in pids(tmp_path, 2))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_launcher_stops_every_rank(tmp_path: Path, sig: signal.Signals) -> None:
    script = write(tmp_path / "rank.py", WAITING_RANK)
    proc = subprocess.Popen(
        launcher_cmd("-n", "2", "--grace-period", "2", str(script), str(tmp_path)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for_files([tmp_path / "pid0", tmp_path / "pid1"], proc)
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=SAFETY)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, err
    assert f"received {sig.name}: stopping all ranks" in err
    assert not any(pid_alive(x) for x in pids(tmp_path, 2))


def test_max_restarts(tmp_path: Path) -> None:
    script = write(tmp_path / "flaky.py", """
        import os, sys
        attempt = int(os.environ["PROCGROUP_RESTART_COUNT"])
        print(f"attempt {attempt}")
        if os.environ["RANK"] == "0" and attempt < 2:
            sys.exit(3)
    """)
    logs = tmp_path / "logs"
    ok = launch("-n", "2", "--max-restarts", "2", "--grace-period", "1",
                "--log-dir", str(logs), str(script))
    assert ok.returncode == 0, ok.stderr
    assert "restarting all local ranks (restart 1 of 2)" in ok.stderr
    assert "restarting all local ranks (restart 2 of 2)" in ok.stderr
    assert "job failed (attempt 2 of 3)" in ok.stderr
    assert "[rank0]: attempt 2" in ok.stdout.splitlines()
    assert (logs / "rank0.stdout.log").read_text() == "attempt 0\n"
    assert (logs / "rank0.restart2.stdout.log").read_text() == "attempt 2\n"

    bad = launch("-n", "2", "--max-restarts", "1", "--grace-period", "1", str(script))
    assert bad.returncode == 3, bad.stderr
    assert "restarting all local ranks (restart 1 of 1)" in bad.stderr
    assert "job failed (attempt 2 of 2)" in bad.stderr
    assert "exited with code 3" in bad.stderr
    assert "[rank0]: attempt 2" not in bad.stdout


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "args, message",
    [
        (["-n", "0", "x.py"], "--nproc-per-node must be >= 1"),
        (["--nnodes", "2", "--node-rank", "2", "--master-port", "1234", "x.py"], "--node-rank must be in [0, 1]"),
        (["--nnodes", "2", "--node-rank", "0", "x.py"], "--master-port is required with --nnodes > 1"),
        (["--nnodes", "2", "--master-port", "1234", "x.py"], "--node-rank is required with --nnodes 2"),
        (["--master-port", "70000", "x.py"], "--master-port must be in [1, 65535]"),
        (["--timeout", "0", "x.py"], "--timeout must be > 0"),
        (["--max-restarts", "-1", "x.py"], "--max-restarts must be >= 0"),
        (["no_such_script.py"], "script not found: 'no_such_script.py'"),
    ],
)
def test_bad_arguments(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "x.py").write_text("raise SystemExit('must not run')\n")
    res = launch(*args, cwd=tmp_path)
    assert res.returncode == 2
    assert f"procgroup-run: error: {message}" in res.stderr
    assert "must not run" not in res.stderr


# ---------------------------------------------------------------------------- real job


def test_real_tcp_job(tmp_path: Path) -> None:
    """A procgroup job over tcp: init from the launcher's env:// variables and --backend."""
    script = write(tmp_path / "job.py", """
        import json, os
        import numpy as np
        import procgroup as pg
        from procgroup.utils import comm
        pg.init_process_group(timeout=60)  # backend from PROCGROUP_BACKEND, env:// rendezvous
        rank, size = pg.get_rank(), pg.get_world_size()
        a = np.full(4, rank + 1.0)
        pg.all_reduce(a)
        out = {"rank": rank, "size": size, "backend": str(pg.get_backend()),
               "sum": a.tolist(), "local_size": comm.get_local_size(),
               "local_rank": comm.get_local_rank()}
        pg.destroy_process_group()
        print("RESULT " + json.dumps(out))
    """)
    res = launch("-n", "3", "--backend", "tcp", "--timeout", "100", str(script))
    assert res.returncode == 0, res.stderr
    results = sorted((json.loads(line.split("RESULT ", 1)[1]) for line in res.stdout.splitlines()
                      if "RESULT " in line), key=lambda r: r["rank"])
    assert [r["rank"] for r in results] == [0, 1, 2]
    for r in results:
        assert r["size"] == 3
        assert "tcp" in r["backend"].lower()
        assert r["sum"] == [6.0] * 4
        assert r["local_size"] == 3
        assert r["local_rank"] == r["rank"]


def test_real_tcp_job_failure_names_the_root_cause(tmp_path: Path) -> None:
    """Rank 1 raises inside a live tcp job; the others then fail with PeerError. The
    summary must blame rank 1 and print its traceback once."""
    script = write(tmp_path / "job.py", """
        import os
        import numpy as np
        import procgroup as pg
        pg.init_process_group(timeout=60)
        rank = pg.get_rank()
        pg.barrier()
        if rank == 1:
            raise RuntimeError("rank one gives up")
        a = np.ones(8)
        pg.all_reduce(a)  # never completes: rank 1 is gone
        print("UNREACHABLE", flush=True)
    """)
    res = launch("-n", "3", "--backend", "tcp", "--timeout", "100", "--grace-period", "2",
                 str(script))
    assert res.returncode == 1, res.stderr
    assert "UNREACHABLE" not in res.stdout
    err = res.stderr
    assert re.search(r"root cause: rank 1 \(node 0, local rank 1, pid \d+\) exited with code 1", err), err
    assert err.count("Traceback (most recent call last)") == 1, err
    assert err.count('raise RuntimeError("rank one gives up")') == 1, err
    assert "[rank1]: RuntimeError: rank one gives up" in err.splitlines()
    assert "job timed out" not in err


def test_ranks_die_with_a_killed_launcher(tmp_path: Path) -> None:
    """SIGKILL cannot be forwarded; the ranks still go (PR_SET_PDEATHSIG in the bootstrap)."""
    script = write(tmp_path / "rank.py", WAITING_RANK)
    proc = subprocess.Popen(launcher_cmd("-n", "2", str(script), str(tmp_path)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_files([tmp_path / "pid0", tmp_path / "pid1"], proc)  # type: ignore[arg-type]  # a Popen stands in for the launcher handle
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    ranks = pids(tmp_path, 2)
    deadline = time.monotonic() + 60  # a bound on waiting, not a timing assertion
    while any(pid_alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in ranks)


# ---------------------------------------------------------------------------- blame (issue 18)


def test_exit_code_while_peers_wait_in_barrier_blames_that_rank(tmp_path: Path) -> None:
    """Rank 1 sys.exit(3)s while the others wait in a barrier: its atexit teardown lets the
    peers fail (PeerError) before it has ended, yet the summary names rank 1, code 3, and
    the tail of its output; the launcher exits 3. The grace period is long enough for the
    survivors to raise and exit on a loaded machine (their exit writes a flight record)."""
    script = write(tmp_path / "job.py", """
        import sys
        import procgroup as pg
        pg.init_process_group(timeout=60)
        rank = pg.get_rank()
        print(f"rank {rank} step 1", flush=True)
        pg.barrier()
        if rank == 1:
            print("rank one leaves with 3", file=sys.stderr, flush=True)
            sys.exit(3)
        pg.barrier()  # never completes: rank 1 is gone
        print("UNREACHABLE", flush=True)
    """)
    for _ in range(2):  # it was wrong 5 of 5 times; twice right is a real check of the order
        res = launch("-n", "3", "--backend", "tcp", "--timeout", "100", "--grace-period", "10",
                     str(script))
        err = res.stderr
        assert res.returncode == 3, err
        assert "UNREACHABLE" not in res.stdout
        assert re.search(r"root cause: rank 1 \(node 0, local rank 1, pid \d+\) exited with code 3\n", err), err
        tail = err.split("last ", 1)[1]
        assert tail.startswith("2 lines of rank 1's output:\n"), err
        assert "procgroup-run:   | rank 1 step 1\n" in tail
        assert "procgroup-run:   | rank one leaves with 3\n" in tail
        others = err.split("other ranks:", 1)[1]
        assert re.search(r"rank 0 \(.*\) .*PeerError", others) and re.search(r"rank 2 \(.*\) .*PeerError", others), err


# ---------------------------------------------------------------------------- --backend mpi

MPI_JOB = """
    import json, os, sys
    import numpy as np
    import procgroup as pg
    pg.init_process_group(timeout=60)  # backend mpi from --backend: ranks from MPI
    rank, size = pg.get_rank(), pg.get_world_size()
    restart = int(os.environ["PROCGROUP_RESTART_COUNT"])
    a = np.full(4, rank + 1.0)
    pg.all_reduce(a)
    print("RESULT " + json.dumps({"rank": rank, "size": size, "sum": a.tolist(),
                                   "backend": str(pg.get_backend()), "restart": restart,
                                   "env": [os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")]}))
    print(f"err-line {rank}", file=sys.stderr)
    if restart == 0 and rank == 1:
        print("rank 1 gives up with 3", flush=True)
        sys.exit(3)
    pg.barrier()
    pg.destroy_process_group()
"""


def test_mpi_backend_one_world_blame_and_restart(tmp_path: Path) -> None:
    """--backend mpi starts the ranks through mpiexec: one MPI world of 3 (not 3 worlds of
    1), with the launcher's env, prefixes, separate streams and log files; the first attempt
    fails (rank 1 sys.exit(3) while the others wait in a barrier) and is blamed on rank 1,
    the restart (PROCGROUP_RESTART_COUNT=1) succeeds."""
    require_mpi()
    script = write(tmp_path / "job.py", MPI_JOB)
    logs = tmp_path / "logs"
    res = launch("-n", "3", "--backend", "mpi", "--max-restarts", "1", "--grace-period", "2",
                 "--timeout", "100", "--log-dir", str(logs), str(script))
    out, err = res.stdout, res.stderr
    assert res.returncode == 0, err
    assert re.search(r"root cause: rank 1 \(node 0, local rank 1, pid \d+\) exited with code 3\n", err), err
    assert "procgroup-run:   | rank 1 gives up with 3" in err
    assert "job failed (attempt 1 of 2)" in err and "restarting all local ranks (restart 1 of 1)" in err
    results = [json.loads(m.group(2)) for m in re.finditer(r"^\[rank(\d)\]: RESULT (.*)$", out, re.MULTILINE)]
    second = sorted((r for r in results if r["restart"] == 1), key=lambda r: r["rank"])
    assert [r["rank"] for r in second] == [0, 1, 2], out
    for r in second:
        assert r["size"] == 3 and "mpi" in r["backend"].lower()
        assert r["sum"] == [6.0] * 4
        assert r["env"] == [str(r["rank"]), str(r["rank"]), "3"]
        assert f"[rank{r['rank']}]: RESULT " in out
    for rank in range(3):
        assert f"[rank{rank}]: err-line {rank}" in err.splitlines()
        assert f"err-line {rank}" not in out
        assert f'"rank": {rank}' in (logs / f"rank{rank}.restart1.stdout.log").read_text()
        assert (logs / f"rank{rank}.restart1.stderr.log").read_text() == f"err-line {rank}\n"


def test_mpi_backend_never_makes_worlds_of_one(tmp_path: Path) -> None:
    """No mpiexec, or one that does not start an MPI world: a clear error, never N
    separate worlds of size 1 that "succeed"."""
    require_mpi()
    script = write(tmp_path / "job.py", MPI_JOB)
    import os

    res = subprocess.run(launcher_cmd("-n", "2", "--backend", "mpi", str(script)), capture_output=True,
                         text=True, timeout=SAFETY, check=False,
                         env={**os.environ, "PROCGROUP_MPIEXEC": str(tmp_path / "no-such-mpiexec")})
    assert res.returncode == 2
    assert "procgroup-run: error: PROCGROUP_MPIEXEC=" in res.stderr and "not an executable" in res.stderr
    # an "mpiexec" that just runs the command once, without any MPI process manager
    fake = tmp_path / "fake-mpiexec"
    fake.write_text('#!/bin/sh\nshift 2\nexec "$@"\n')
    fake.chmod(0o755)
    res = subprocess.run(launcher_cmd("-n", "2", "--backend", "mpi", "--grace-period", "1", str(script)),
                         capture_output=True, text=True, timeout=SAFETY, check=False,
                         env={**os.environ, "PROCGROUP_MPIEXEC": str(fake)})
    assert res.returncode != 0, res.stderr
    assert "RESULT" not in res.stdout
    assert "was not started by an MPI launcher" in res.stderr, res.stderr
    res = launch("--nnodes", "2", "--node-rank", "0", "--master-port", "29999", "--backend", "mpi", str(script))
    assert res.returncode == 2 and "start the job with mpiexec itself" in res.stderr


def test_mpi_ranks_die_with_a_killed_launcher(tmp_path: Path) -> None:
    require_mpi()
    script = write(tmp_path / "rank.py", WAITING_RANK)
    proc = subprocess.Popen(launcher_cmd("-n", "2", "--backend", "mpi", str(script), str(tmp_path)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_files([tmp_path / "pid0", tmp_path / "pid1"], proc)  # type: ignore[arg-type]  # a Popen stands in for the launcher handle
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    ranks = pids(tmp_path, 2)
    deadline = time.monotonic() + 60  # a bound on waiting, not a timing assertion
    while any(pid_alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in ranks)


# ---------------------------------------------------------------------------- torchrun habits


ENV_SCRIPT = """
    import json, os, sys
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
            "ROLE_NAME", "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "PROCGROUP_RESTART_COUNT",
            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
            "TORCHELASTIC_ERROR_FILE", "PROCGROUP_ERROR_FILE"]
    env = {k: os.environ.get(k) for k in keys}
    print("ENV " + json.dumps(env))
    print(f"out {env['LOCAL_RANK']}")
    print(f"err {env['LOCAL_RANK']}", file=sys.stderr)
    if env["RANK"] == "0" and env["TORCHELASTIC_RESTART_COUNT"] == "0":
        sys.exit(5)
"""


def test_torchrun_spellings_standalone_restarts_and_filter(tmp_path: Path) -> None:
    """A torchrun command line: underscore spellings, --standalone (its --master_port is
    ignored), --nproc_per_node cpu, --max_restarts with TORCHELASTIC_RESTART_COUNT in the
    restarted ranks, --rdzv_id/--role, --local_ranks_filter (console only), --log_dir."""
    import os

    from procgroup._launch.options import parse_nproc

    script = write(tmp_path / "env.py", ENV_SCRIPT)
    logs = tmp_path / "logs"
    res = launch("--standalone", "--nnodes=1", "--nproc_per_node", "cpu", "--master_port", "1",
                 "--max_restarts=1", "--rdzv_id", "job-42", "--role", "trainer",
                 "--rdzv_backend", "c10d", "--monitor_interval", "0.02", "--start_method", "fork",
                 "--local_ranks_filter", "0", "--log_dir", str(logs), "--grace_period", "1",
                 "--run_path", str(script.relative_to(tmp_path)), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    n = os.cpu_count() or 1
    assert parse_nproc("cpu") == n
    envs = [json.loads(line.split("ENV ", 1)[1]) for line in res.stdout.splitlines() if "ENV " in line]
    assert {e["LOCAL_RANK"] for e in envs} == {"0"}  # the filter: only local rank 0 on the console
    final = [e for e in envs if e["TORCHELASTIC_RESTART_COUNT"] == "1"]
    assert len(final) == 1
    e = final[0]
    assert e["PROCGROUP_RESTART_COUNT"] == "1" and e["TORCHELASTIC_MAX_RESTARTS"] == "1"
    assert e["TORCHELASTIC_RUN_ID"] == "job-42" and e["ROLE_NAME"] == "trainer" and e["ROLE_RANK"] == "0"
    assert e["WORLD_SIZE"] == str(n) and e["GROUP_WORLD_SIZE"] == "1" and e["GROUP_RANK"] == "0"
    assert e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"] != "1"  # --standalone: a free port
    assert e["TORCHELASTIC_ERROR_FILE"] == e["PROCGROUP_ERROR_FILE"] == str(logs / "rank0.restart1.error.json")
    assert "exited with code 5" in res.stderr and "restarting all local ranks (restart 1 of 1)" in res.stderr
    if n > 1:  # the other ranks ran, into their files only
        assert "out 1" not in res.stdout and "err 1" not in res.stderr
        assert (logs / "rank1.restart1.stdout.log").read_text().endswith("out 1\n")
        assert (logs / "rank1.restart1.stderr.log").read_text() == "err 1\n"


def test_redirects_and_tee(tmp_path: Path) -> None:
    """--redirects: those streams only into the log files; --tee: console and files; no
    --log-dir: the launcher names the directory it made (as torchrun does)."""
    script = write(tmp_path / "env.py", """
        import os, sys
        r = os.environ["LOCAL_RANK"]
        print(f"out {r}")
        print(f"err {r}", file=sys.stderr)
    """)
    res = launch("-n", "3", "-r", "0:3,1:2", "--tee", "2:1", str(script))
    assert res.returncode == 0, res.stderr
    m = re.search(r"procgroup-run: log files in (\S+) \(no --log-dir given\)", res.stderr)
    assert m, res.stderr
    d = Path(m.group(1))
    try:
        out, err = res.stdout.splitlines(), res.stderr.splitlines()
        assert "[rank0]: out 0" not in out and "[rank0]: err 0" not in err  # 0:3 both redirected
        assert (d / "rank0.stdout.log").read_text() == "out 0\n" and (d / "rank0.stderr.log").read_text() == "err 0\n"
        assert "[rank1]: out 1" in out and "[rank1]: err 1" not in err  # 1:2 stderr redirected
        assert (d / "rank1.stderr.log").read_text() == "err 1\n" and not (d / "rank1.stdout.log").exists()
        assert "[rank2]: out 2" in out and "[rank2]: err 2" in err  # 2:1 stdout teed
        assert (d / "rank2.stdout.log").read_text() == "out 2\n" and not (d / "rank2.stderr.log").exists()
    finally:
        import shutil

        shutil.rmtree(d, ignore_errors=True)


def test_no_python_run_path_and_non_python_targets(tmp_path: Path) -> None:
    sh = tmp_path / "job.sh"
    sh.write_text('#!/bin/sh\necho "sh rank $RANK of $WORLD_SIZE args $*"\n')
    sh.chmod(0o755)
    res = launch("--no_python", "-n", "2", str(sh), "a", "-n", "7")
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["[rank0]: sh rank 0 of 2 args a -n 7",
                                               "[rank1]: sh rank 1 of 2 args a -n 7"]
    # a program found on PATH, like torchrun --no-python (which runs it as it is)
    res = launch("--no-python", "-n", "1", "echo", "hi")
    assert res.returncode == 0 and res.stdout == "[rank0]: hi\n", res.stderr
    res = launch("--no-python", "-n", "1", "no-such-program-xyz")
    assert res.returncode == 127
    assert "cannot execute 'no-such-program-xyz'" in res.stderr and "root cause: rank 0" in res.stderr
    # not Python, no --no-python: a clear error before anything starts (was: null bytes)
    for target, what in ((str(sh), "a script for /bin/sh"), ("/bin/true", "an ELF executable")):
        res = launch("-n", "2", target)
        assert res.returncode == 2
        assert f"procgroup-run: error: {target!r} is not a Python script ({what}); to run a program, add --no-python" in res.stderr
    # --run-path wins over --no-python: the Python script runs under the bootstrap
    py = write(tmp_path / "tool", "#!/usr/bin/env python3\nimport os\nprint('py', os.environ['RANK'], __name__)\n")
    res = launch("--run-path", "--no-python", "-n", "1", str(py))
    assert res.returncode == 0 and res.stdout == "[rank0]: py 0 __main__\n", res.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--nnodes", "1:4", "x.py"], "--nnodes 1:4: elastic ranges are not supported"),
        (["-n", "many", "x.py"], "--nproc-per-node must be a number or auto, cpu, gpu; got 'many'"),
        (["--redirects", "5", "x.py"], "--redirects must be 0 (none), 1 (stdout), 2 (stderr), 3 (both)"),
        (["-n", "2", "--tee", "3:1", "x.py"], "--tee names local rank(s) [3], outside [0, 1]"),
        (["-n", "2", "--local-ranks-filter", "0,x", "x.py"], "--local-ranks-filter must be comma-separated"),
        (["--rdzv-endpoint", "h:1", "--master-addr", "h", "x.py"], "give either --rdzv-endpoint or --master-addr"),
        (["--standalone", "--nnodes", "2", "x.py"], "--standalone is for one node"),
        (["-m", "--no-python", "x"], "-m and --no-python exclude each other"),
    ],
)
def test_bad_torchrun_arguments(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "x.py").write_text("raise SystemExit('must not run')\n")
    res = launch(*args, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert f"procgroup-run: error: {message}" in res.stderr
    assert "must not run" not in res.stderr


def test_nproc_per_node_gpu_and_auto() -> None:
    from procgroup._launch.options import gpu_count, parse_nproc
    from procgroup.errors import InvalidArgumentError

    gpus = gpu_count()
    assert parse_nproc("auto") == (gpus or __import__("os").cpu_count())
    if gpus:
        assert parse_nproc("gpu") == gpus
    else:
        with pytest.raises(InvalidArgumentError, match="--nproc-per-node gpu: no CUDA device"):
            parse_nproc("gpu")


# ---------------------------------------------------------------------------- logging


def test_log_level_rank_prefix_and_unlaunched_error(tmp_path: Path) -> None:
    """PROCGROUP_LOG_LEVEL sets procgroup's loggers; lines say their rank ("[rank 1] ...")
    unless procgroup-run's own prefix does; a bad level is refused; a program started
    without a launcher is told the procgroup-run command that would start it."""
    import os

    script = write(tmp_path / "logjob.py", """
        import logging
        import procgroup as pg
        pg.init_process_group(timeout=60)
        logging.getLogger("procgroup.user").info("info from the job")
        logging.getLogger("procgroup.user").debug("debug from the job")
        pg.destroy_process_group()
    """)
    base = {k: v for k, v in os.environ.items() if k != "PROCGROUP_LOG_LEVEL"}

    def run(*args: str, level: str | None) -> subprocess.CompletedProcess[str]:
        env = dict(base, **({"PROCGROUP_LOG_LEVEL": level} if level else {}))
        return subprocess.run(launcher_cmd(*args, str(script)), capture_output=True, text=True,
                              timeout=SAFETY, env=env, check=False)

    res = run("-n", "2", "--backend", "tcp", "--no-prefix", level="info")
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    for rank in (0, 1):
        assert f"[rank {rank}] INFO procgroup.user: info from the job" in lines
        assert f"[rank {rank}] INFO procgroup._lifecycle: rank {rank} of 2 joined the tcp process group" in lines
    assert "debug from the job" not in res.stderr
    res = run("-n", "2", "--backend", "tcp", level="DEBUG")  # launcher prefix: no second one
    assert res.returncode == 0, res.stderr
    assert "[rank1]: DEBUG procgroup.user: debug from the job" in res.stderr.splitlines()
    assert "[rank 1]" not in res.stderr
    assert "procgroup-run: INFO: procgroup._launch.supervisor: node 0/1: starting 2 ranks" in res.stderr
    res = run("-n", "2", level="chatty")
    assert res.returncode == 2
    assert "procgroup-run: error: PROCGROUP_LOG_LEVEL='chatty': use one of DEBUG, INFO" in res.stderr
    res = run("-n", "1", level=None)
    assert res.returncode == 0 and "info from the job" not in res.stderr  # default: WARNING

    # no launcher: the env:// error names the command
    env = {k: v for k, v in base.items() if k not in (
        "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
        "PMIX_RANK", "SLURM_PROCID", "PROCGROUP_BACKEND")}
    res = subprocess.run([sys.executable, "logjob.py", "--lr", "0.1"], capture_output=True, text=True,
                         timeout=SAFETY, env=env, cwd=tmp_path, check=False)
    assert res.returncode == 1
    assert "env://: RANK is not set, so this process was not started by a launcher. Start the " \
           "program with `procgroup-run --nproc-per-node 4 logjob.py --lr 0.1`, or set RANK, " \
           "WORLD_SIZE, MASTER_ADDR and MASTER_PORT" in res.stderr, res.stderr


# ---------------------------------------------------------------------------- multi-host


class TwoHosts:
    """Two network namespaces ("hosts") on one bridge in a third: 10.79.0.1 and 10.79.0.2."""

    def __init__(self) -> None:
        import os

        tag = f"pgl{os.getpid() % 100000}"
        self.switch, self.hosts = f"{tag}sw", [f"{tag}h0", f"{tag}h1"]
        self.created: list[str] = []

    @staticmethod
    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)

    def create(self) -> None:
        for ns in (self.switch, *self.hosts):
            self.ip("netns", "add", ns)
            self.created.append(ns)
            self.ip("-n", ns, "link", "set", "lo", "up")
        self.ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        self.ip("-n", self.switch, "link", "set", "br0", "up")
        for i, ns in enumerate(self.hosts):
            self.ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}",
                    "netns", self.switch)
            self.ip("-n", self.switch, "link", "set", f"p{i}", "master", "br0", "up")
            self.ip("-n", ns, "addr", "add", f"10.79.0.{i + 1}/24", "dev", "eth0")
            self.ip("-n", ns, "link", "set", "eth0", "up")

    def delete(self) -> None:
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)
        self.created.clear()


def test_two_hosts_with_rdzv_endpoint(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """torchrun's multi-node spelling across two network namespaces: --nnodes 2 --node_rank i
    --rdzv_endpoint HOST:PORT, one launcher per "host", one tcp world of 4."""
    import os
    import shutil

    if sys.platform != "linux" or os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("netns: network namespaces need Linux, root and the `ip` tool (iproute2)")
    net = TwoHosts()
    request.addfinalizer(net.delete)
    try:
        net.create()
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"netns: cannot create network namespaces here: {exc.stderr.strip()}")
    script = write(tmp_path / "job.py", """
        import json, os
        import numpy as np
        import procgroup as pg
        pg.init_process_group(timeout=90)
        a = np.full(3, pg.get_rank() + 1.0)
        pg.all_reduce(a)
        hosts = [None] * pg.get_world_size()
        pg.all_gather_object(hosts, os.environ["PGTEST_HOST"])
        print("RESULT " + json.dumps({"rank": pg.get_rank(), "size": pg.get_world_size(),
                                      "sum": a.tolist(), "hosts": hosts,
                                      "group": os.environ["GROUP_RANK"]}), flush=True)
        pg.destroy_process_group()
    """)
    env = dict(os.environ, PROCGROUP_JOB_TOKEN="two-hosts-test-token")
    procs = [
        subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "procgroup.run", "--nnodes", "2",
             "--node_rank", str(i), "--nproc_per_node", "2", "--rdzv_endpoint", "10.79.0.1:29411",
             "--rdzv_backend", "c10d", "--backend", "tcp", "--timeout", "150", str(script)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(env, PGTEST_HOST=f"h{i}"),
        )
        for i, ns in enumerate(net.hosts)
    ]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=200))
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=30)
    report = "".join(f"--- host {i}: exit {p.returncode}\n{o}\n{e}\n" for i, (p, (o, e)) in enumerate(zip(procs, outs)))
    assert all(p.returncode == 0 for p in procs), report
    results = {}
    for out, _ in outs:
        for line in out.splitlines():
            if "RESULT " in line:
                r = json.loads(line.split("RESULT ", 1)[1])
                results[r["rank"]] = r
    assert sorted(results) == [0, 1, 2, 3], report
    for rank, r in results.items():
        assert r["size"] == 4 and r["sum"] == [10.0] * 3
        assert r["hosts"] == ["h0", "h0", "h1", "h1"] and r["group"] == str(rank // 2)
