"""A one-node Slurm on this machine for the tests: munged, slurmctld and slurmd (and, with accounting,
MariaDB and slurmdbd), configured in a temporary folder and stopped by process id.

Everything listens on 127.0.0.1 at free ports and uses its own munge socket, so a Slurm or munge
already installed here is left alone. Each daemon runs under `timeout`, so none outlives a test run
that dies before its clean-up. Clients find the cluster through `SLURM_CONF`.

    with LocalSlurm(accounting=False) as slurm:   # raises SlurmUnavailable with the reason
        subprocess.run(["sbatch", ...], env=slurm.env)

The daemons need root (slurmd starts jobs as their user) and Debian's `slurm-wlm` and `munge`
(`slurmdbd` and `mariadb-server` for accounting): `make test-slurm` installs them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

# No daemon lives longer than this, whatever happens to the process that started it.
DAEMON_LIFETIME_S = 1800
START_TIMEOUT_S = 60.0
CLUSTER = "tfla"
PARTITION = "debug"
NODE = "localhost"


class SlurmUnavailable(RuntimeError):
    """The daemons cannot run here; the message says why in one line."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalSlurm:
    """One Slurm node on localhost.

    Args:
        accounting: run slurmdbd over a MariaDB of its own, so `sacct` answers; without it the
            cluster has no accounting (`accounting_storage/none`), and `sacct` fails.
        defaults: keep Slurm's own `KillWait` (30 s) and `MinJobAge` (300 s), as a cluster does;
            otherwise both are short, so the tests wait less for cancelled and ended jobs.
    """

    def __init__(self, accounting: bool, defaults: bool = False) -> None:
        self.accounting = accounting
        self.defaults = defaults
        self.folder = Path(tempfile.mkdtemp(prefix="tfla-slurm-"))
        self.conf = self.folder / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._daemons: list[tuple[str, subprocess.Popen]] = []

    def __enter__(self) -> LocalSlurm:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------------

    def start(self) -> None:
        if os.geteuid() != 0:
            raise SlurmUnavailable("the Slurm daemons need root (slurmd starts jobs as their user)")
        needed = ["munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "timeout"]
        if self.accounting:
            needed += ["slurmdbd", "mariadbd", "mariadb-install-db"]
        missing = [name for name in needed if shutil.which(name) is None]
        if missing:
            raise SlurmUnavailable(f"not installed: {', '.join(missing)} (make test-slurm installs them)")
        self._start_munge()
        dbd_port = self._start_accounting() if self.accounting else None
        self._write_slurm_conf(dbd_port)
        self.start_controller()
        self._spawn("slurmd", ["slurmd", "-D", "-N", NODE, "-f", str(self.conf)])
        self._wait(self._node_idle, f"node {NODE} to be idle")

    def start_controller(self) -> None:
        """Start slurmctld (again: it reads the jobs it saved) and wait until it answers."""
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self._ok(["scontrol", "ping"]), "slurmctld to answer scontrol ping")

    def stop_controller(self) -> None:
        """Stop slurmctld as an administrator does (SIGTERM: it saves its state); the jobs and the
        other daemons go on."""
        for entry in [entry for entry in self._daemons if entry[0] == "slurmctld"]:
            entry[1].send_signal(signal.SIGTERM)
            entry[1].wait(30)
            self._daemons.remove(entry)

    def stop(self) -> None:
        """Stop every daemon, the last started first, by its process id; remove the folder (kept with
        TFLA_BENCH_SLURM_KEEP=1, to read the daemons' logs).

        Jobs are cancelled first; a job step outlives slurmd (slurmstepd detaches from it), so any
        process still running under this cluster's config afterwards is killed by its id."""
        if any(name == "slurmctld" and process.poll() is None for name, process in self._daemons):
            subprocess.run(
                ["scancel", "--full", "--user=root"], env=self.env, capture_output=True, timeout=30
            )
            deadline = time.monotonic() + 30
            while self._queued() and time.monotonic() < deadline:
                time.sleep(0.5)
        for _, process in reversed(self._daemons):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)  # `timeout` hands it on to the daemon
        for _, process in reversed(self._daemons):
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        self._daemons.clear()
        for pid in self._job_processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not os.environ.get("TFLA_BENCH_SLURM_KEEP"):
            shutil.rmtree(self.folder, ignore_errors=True)

    def _queued(self) -> bool:
        out = subprocess.run(
            ["squeue", "--noheader", "--format=%i"], env=self.env, capture_output=True, text=True, timeout=30
        )
        return out.returncode == 0 and bool(out.stdout.strip())

    def _job_processes(self) -> list[int]:
        """The processes started under this cluster's config (slurmstepd and the jobs), not this one."""
        mark = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if mark in environ.split(b"\0"):
                found.append(int(entry.name))
        return found

    def log(self, name: str) -> str:
        """The last lines of a daemon's log (for a failure message)."""
        path = self.folder / f"{name}.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return ""

    # ------------------------------------------------------------------------------------------

    def _spawn(self, name: str, command: list[str]) -> None:
        log = (self.folder / f"{name}.out").open("wb")
        process = subprocess.Popen(
            ["timeout", "-k", "10", str(DAEMON_LIFETIME_S), *command],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,  # a Ctrl-C of the tests reaches the daemons through stop() only
        )
        log.close()
        self._daemons.append((name, process))
        time.sleep(0.2)
        if process.poll() is not None:
            raise SlurmUnavailable(f"{name} exited at once: {self._last_words(name)}")

    def _last_words(self, name: str) -> str:
        text = (self.folder / f"{name}.out").read_text(errors="replace") + self.log(name)
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines[-1] if lines else "no output"

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            for name, process in self._daemons:
                if process.poll() is not None:
                    raise SlurmUnavailable(
                        f"{name} exited while waiting for {what}: {self._last_words(name)}"
                    )
            if time.monotonic() > deadline:
                raise SlurmUnavailable(f"no {what} within {START_TIMEOUT_S:g} s")
            time.sleep(0.5)

    def _ok(self, command: list[str]) -> bool:
        return subprocess.run(command, env=self.env, capture_output=True, timeout=30).returncode == 0

    def _node_idle(self) -> bool:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"], env=self.env, capture_output=True, text=True, timeout=30
        )
        return out.returncode == 0 and out.stdout.strip().rstrip("*") == "idle"

    def _start_munge(self) -> None:
        key = self.folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.munge_socket = self.folder / "munge.socket"
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",  # the folder is under /tmp, which munged would otherwise distrust
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={self.folder / 'munged.pid'}",
                f"--log-file={self.folder / 'munged.log'}",
                f"--seed-file={self.folder / 'munged.seed'}",
            ],
        )
        self._wait(self.munge_socket.exists, "munge socket")

    def _start_accounting(self) -> int:
        """MariaDB on 127.0.0.1 without grants (it is this test's own), then slurmdbd over it."""
        data = self.folder / "mariadb"
        db_port, dbd_port = free_port(), free_port()
        install = subprocess.run(
            ["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root", "--skip-test-db"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if install.returncode != 0:
            raise SlurmUnavailable(f"mariadb-install-db failed: {install.stderr.strip().splitlines()[-1:]}")
        self._spawn(
            "mariadbd",
            [
                "mariadbd",
                "--no-defaults",
                f"--datadir={data}",
                "--user=root",
                "--bind-address=127.0.0.1",
                f"--port={db_port}",
                f"--socket={self.folder / 'mariadb.socket'}",
                f"--pid-file={self.folder / 'mariadb.pid'}",
                f"--log-error={self.folder / 'mariadbd.log'}",
                "--skip-grant-tables",
                "--innodb-buffer-pool-size=64M",
            ],
        )
        self._wait(lambda: _listening(db_port), "MariaDB on its port")
        dbd_conf = self.folder / "slurmdbd.conf"
        dbd_conf.write_text(
            _lines(
                AuthType="auth/munge",
                AuthInfo=f"socket={self.munge_socket}",
                DbdHost="localhost",
                DbdAddr="127.0.0.1",
                DbdPort=dbd_port,
                SlurmUser="root",
                StorageType="accounting_storage/mysql",
                StorageHost="127.0.0.1",
                StoragePort=db_port,
                StorageUser="root",
                StorageLoc="slurm_acct_db",
                PidFile=self.folder / "slurmdbd.pid",
                LogFile=self.folder / "slurmdbd.log",
            )
        )
        dbd_conf.chmod(0o600)  # slurmdbd refuses a readable file: it may hold the storage password
        # slurmdbd reads slurmdbd.conf beside SLURM_CONF's file.
        self._spawn("slurmdbd", ["slurmdbd", "-D"])
        self._wait(lambda: _listening(dbd_port), "slurmdbd on its port")
        return dbd_port

    def _write_slurm_conf(self, dbd_port: int | None) -> None:
        for name in ("state", "spool"):
            (self.folder / name).mkdir()
        accounting = (
            {
                "AccountingStorageType": "accounting_storage/slurmdbd",
                "AccountingStorageHost": "localhost",
                "AccountingStoragePort": dbd_port,
                # For munge, the "password" is the socket that authenticates to slurmdbd.
                "AccountingStoragePass": self.munge_socket,
            }
            if dbd_port is not None
            else {"AccountingStorageType": "accounting_storage/none"}
        )
        self.conf.write_text(
            _lines(
                ClusterName=CLUSTER,
                SlurmctldHost=f"{NODE}(127.0.0.1)",
                SlurmctldPort=free_port(),
                SlurmdPort=free_port(),
                SlurmUser="root",
                SlurmdUser="root",
                AuthType="auth/munge",
                AuthInfo=f"socket={self.munge_socket}",
                StateSaveLocation=self.folder / "state",
                SlurmdSpoolDir=self.folder / "spool",
                SlurmctldPidFile=self.folder / "slurmctld.pid",
                SlurmdPidFile=self.folder / "slurmd.pid",
                SlurmctldLogFile=self.folder / "slurmctld.log",
                SlurmdLogFile=self.folder / "slurmd.log",
                # No cgroups: processes are tracked by parent id, tasks are not bound.
                ProctrackType="proctrack/linuxproc",
                TaskPlugin="task/none",
                JobAcctGatherType="jobacct_gather/none",
                MpiDefault="none",
                SchedulerType="sched/builtin",
                SelectType="select/cons_tres",
                SelectTypeParameters="CR_CPU",
                ReturnToService=2,
                # Short timeouts: a node that stops answering is down in 30 s; unless the defaults
                # are asked for, a cancelled job is killed 5 s after its SIGTERM and an ended job
                # leaves squeue 10 s after its end.
                **({} if self.defaults else {"KillWait": 5, "MinJobAge": 10}),
                SlurmctldTimeout=30,
                SlurmdTimeout=30,
                MessageTimeout=10,
                InactiveLimit=0,
                JobCompType="jobcomp/none",
                **accounting,
            )
            + f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN\n"
            + f"PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP\n"
        )


def _lines(**entries: object) -> str:
    return "".join(f"{key}={value}\n" for key, value in entries.items())


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0
