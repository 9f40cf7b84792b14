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
    results = sorted((json.loads(l.split("RESULT ", 1)[1]) for l in res.stdout.splitlines()
                      if "RESULT " in l), key=lambda r: r["rank"])
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
        wait_for_files([tmp_path / "pid0", tmp_path / "pid1"], proc)  # type: ignore[arg-type]
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
