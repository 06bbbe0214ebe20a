"""A Spark standalone cluster on this machine: one master and N workers on 127.0.0.1.

It is the same cluster manager a real deployment uses (`spark://host:7077`), started
from the Spark that pyspark ships (`bin/spark-class`), so `lookout engine` runs on
executors in other JVMs, with Python workers of their own, exactly as on a cluster;
only the lakehouse path is shared through the local disk instead of object storage.

    lookout cluster --workers 2     # prints the master URL, runs until Ctrl-C
    LOOKOUT_ENGINE_MASTER=spark://127.0.0.1:7077 lookout engine
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from engine.spark.spark_home import spark_home
from lookout.broker import free_port


class LocalCluster:
    """A standalone master and `workers` workers, each with `cores` cores and `memory`.

    Logs go to `<work_dir>/<part>.log`; `start()` returns once every worker has
    registered with the master, and `stop()` ends them all.
    """

    def __init__(
        self,
        work_dir: Path,
        workers: int = 2,
        cores: int = 1,
        memory: str = "2g",
        port: int | None = None,
    ) -> None:
        self.work_dir = Path(work_dir)
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = port or free_port()
        self.processes: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        """The master URL to give Spark (`LOOKOUT_ENGINE_MASTER`)."""
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, *args: str) -> Path:
        home = spark_home()
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            # Executors start Python workers: the same interpreter (and packages) as ours.
            "PYSPARK_PYTHON": sys.executable,
        }
        log = self.work_dir / f"{name}.log"
        self.processes.append(
            subprocess.Popen(
                [str(home / "bin" / "spark-class"), *args],
                env=env,
                stdout=log.open("ab"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        return log

    def start(self, timeout: float = 60.0) -> LocalCluster:
        """Start the master, then the workers; wait until all workers registered."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        master_log = self._spawn(
            "master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.port), "--webui-port", str(free_port()),
        )  # fmt: skip
        for n in range(self.workers):
            work = self.work_dir / f"worker-{n}"
            work.mkdir(exist_ok=True)
            self._spawn(
                f"worker-{n}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(work),
                "--webui-port", str(free_port()), self.url,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = master_log.read_text(errors="replace") if master_log.exists() else ""
            if text.count("Registering worker") >= self.workers:
                return self
            for proc in self.processes:
                if proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"a cluster process exited; see {self.work_dir}/*.log")
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"{self.workers} workers did not register in {timeout:.0f}s")

    def stop(self) -> None:
        """Stop every worker and the master (their whole process groups)."""
        for proc in reversed(self.processes):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.processes:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.processes.clear()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
