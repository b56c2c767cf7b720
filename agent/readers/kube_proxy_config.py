"""kube-proxy's own configuration: its command line and its KubeProxyConfiguration file.

Found in the host's process table (the agent's pod needs `hostPID: true`): the kube-proxy process
that shares the agent's network namespace, its flags from /proc/PID/cmdline and its `--config`
file read through /proc/PID/root (the file lives in kube-proxy's container, not in ours). Or, with
`--kube-proxy-config FILE`, from that file alone.

The file is YAML or JSON, read with PyYAML's safe loader (flow mappings, anchors and block
scalars included, as kube-proxy accepts them); a file that is not YAML is an error, reported.

Also here: the kernel's route lookups that hint at the node's primary IP (read-only RTM_GETROUTE).
Nothing in this module raises for an expected failure; each result carries its status.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent import names
from agent.snapshot import Reading

KIND = "KubeProxyConfiguration"
# flag -> field; flags that are booleans take no separate value (pflag)
_FLAGS = {
    "proxy-mode": "mode",
    "config": "config",
    "nodeport-addresses": "node_port_addresses",
    "ipvs-scheduler": "ipvs_scheduler",
    "ipvs-strict-arp": "ipvs_strict_arp",
    "bind-address": "bind_address",
}
_BOOL_FLAGS = frozenset({"ipvs-strict-arp"})


class ConfigError(ValueError):
    """The file is not a KubeProxyConfiguration this parser can read."""


@dataclass(frozen=True)
class KubeProxyConfig:
    """The settings that matter for a migration; None means not set anywhere (the default)."""

    origin: str  # where it was read: "kube-proxy pid 812 (...)" or "--kube-proxy-config F"
    pid: int | None = None
    cmdline: tuple[str, ...] = ()
    config_file: str | None = None  # as kube-proxy names it (--config)
    mode: str | None = None
    node_port_addresses: tuple[str, ...] | None = None
    ipvs_scheduler: str | None = None
    ipvs_strict_arp: bool | None = None
    bind_address: str | None = None
    localhost_node_ports: bool | None = None  # iptables.localhostNodePorts
    # field -> where its value came from ("--proxy-mode flag", "mode: in FILE")
    origins: dict[str, str] = field(default_factory=dict)
    # flags on the command line that kube-proxy ignores because --config is given
    ignored_flags: tuple[str, ...] = ()


# --- command line ---------------------------------------------------------------------------


def is_kube_proxy(argv: list[str] | tuple[str, ...]) -> bool:
    if not argv:
        return False
    base = os.path.basename(argv[0])
    if base == names.KUBE_PROXY_PROGRAM:
        return True
    program, subcommands = names.HYPERKUBE
    return base == program and len(argv) > 1 and argv[1] in subcommands


def parse_flags(argv: list[str] | tuple[str, ...]) -> dict[str, str]:
    """The flags this module cares about, by flag name, as pflag would read them."""
    out: dict[str, str] = {}
    i = 1
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            break
        if not arg.startswith("-") or arg == "-":
            continue
        name, eq, value = arg.lstrip("-").partition("=")
        if name not in _FLAGS:
            continue
        if not eq:
            if name in _BOOL_FLAGS:
                value = "true"
            elif i < len(argv):
                value = argv[i]
                i += 1
            else:
                value = ""
        out[name] = value
    return out


def _bool(value: object, what: str) -> bool:
    if isinstance(value, bool):
        return value
    shown = _text(value, what)
    text = shown.strip().lower()
    if text in ("true", "1", "t"):
        return True
    if text in ("false", "0", "f", ""):
        return False
    raise ConfigError(f"{what}: {shown[:40]!r} is not a boolean")


def _from_flags(flags: dict[str, str], where: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, value in flags.items():
        key = _FLAGS[name]
        if key == "config":
            continue
        if key == "node_port_addresses":
            values[key] = tuple(v.strip() for v in value.split(",") if v.strip())
        elif key == "ipvs_strict_arp":
            values[key] = _bool(value, f"--{name}")
        else:
            values[key] = value
        values.setdefault("_origins", {})[key] = f"--{name} flag ({where})"
    return values


# --- the configuration file -----------------------------------------------------------------


# The pure-Python safe loader (no Python tags): the file is small, and its messages are the
# same whether or not PyYAML was built with libyaml.
_LOADER = yaml.SafeLoader


def parse_yaml(text: str) -> list[Any]:
    """Every document of a YAML file, read by PyYAML's safe loader (YAML 1.1, as kube-proxy's
    sigs.k8s.io/yaml reads it: `yes` is true)."""
    try:
        return list(yaml.load_all(text, Loader=_LOADER))
    except yaml.YAMLError as exc:
        raise ConfigError(f"not YAML: {_yaml_problem(exc)}") from exc
    except (ValueError, OverflowError, RecursionError) as exc:
        # the constructors' own errors (`a: 2024-13-45`, `!!int x`) and deep [[[[ nesting
        raise ConfigError(f"not YAML: {type(exc).__name__}: {str(exc)[:80]}") from exc


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: what and where (`mapping values are not allowed here, line 3 column 9`)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark
        where = f", line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        return f"{exc.problem}{where}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def parse_config_text(text: str) -> dict[str, Any]:
    """The KubeProxyConfiguration document of a YAML or JSON file, as a dict."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            docs: list[Any] = [json.loads(text)]
        except (ValueError, RecursionError) as exc:
            raise ConfigError(f"not JSON: {exc}") from exc
    else:
        docs = parse_yaml(text)
    maps = [d for d in docs if isinstance(d, dict)]
    if not maps:
        raise ConfigError("no KubeProxyConfiguration document in it")
    for d in maps:
        if d.get("kind") == KIND:
            return d
    kinds = sorted({str(d.get("kind")) for d in maps if d.get("kind")})
    if kinds:
        raise ConfigError(f"kind {', '.join(kinds)}, not {KIND}")
    return maps[0]  # no kind at all: kube-proxy would refuse it, but the fields are readable


def _text(value: Any, what: str) -> str:
    """A setting that is a string: a scalar as text; a list or mapping is refused, never
    printed (YAML aliases make a 200-byte file a billion-element list)."""
    if isinstance(value, list | dict | set):
        raise ConfigError(f"{what} is a {type(value).__name__}, not a string")
    return "" if value is None else str(value)


def settings(doc: dict[str, Any], where: str) -> dict[str, Any]:
    """The fields of a parsed KubeProxyConfiguration, with where each came from."""
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}

    def put(key: str, value: Any, path: str) -> None:
        values[key] = value
        origins[key] = f"{path} in {where}"

    if "mode" in doc:
        put("mode", _text(doc["mode"], "mode"), "mode:")
    if "nodePortAddresses" in doc:
        npa = doc["nodePortAddresses"]
        if npa is not None and not isinstance(npa, list):
            raise ConfigError(f"nodePortAddresses is {npa!r}, not a list")
        addresses = tuple(_text(a, "nodePortAddresses") for a in npa or ())
        put("node_port_addresses", addresses, "nodePortAddresses:")
    if doc.get("bindAddress") is not None:
        put("bind_address", _text(doc["bindAddress"], "bindAddress"), "bindAddress:")
    ipvs = doc.get("ipvs")
    if isinstance(ipvs, dict):
        if "scheduler" in ipvs:
            put(
                "ipvs_scheduler",
                _text(ipvs["scheduler"] or "", "ipvs.scheduler"),
                "ipvs.scheduler:",
            )
        if ipvs.get("strictARP") is not None:
            put("ipvs_strict_arp", _bool(ipvs["strictARP"], "ipvs.strictARP"), "ipvs.strictARP:")
    ipt = doc.get("iptables")
    if isinstance(ipt, dict) and ipt.get("localhostNodePorts") is not None:
        put(
            "localhost_node_ports",
            _bool(ipt["localhostNodePorts"], "iptables.localhostNodePorts"),
            "iptables.localhostNodePorts:",
        )
    values["_origins"] = origins
    return values


def _build(origin: str, values: dict[str, Any], **extra: Any) -> KubeProxyConfig:
    origins = values.pop("_origins", {})
    return KubeProxyConfig(origin=origin, origins=origins, **values, **extra)


def read_file(path: str) -> Reading[KubeProxyConfig | None]:
    """`--kube-proxy-config FILE`: the file alone."""
    try:
        text = Path(path).read_text()
        values = settings(parse_config_text(text), path)
    except OSError as exc:
        return Reading("error", None, f"cannot read --kube-proxy-config {path}: {_os_error(exc)}")
    except (ConfigError, UnicodeDecodeError) as exc:
        return Reading("error", None, f"cannot parse --kube-proxy-config {path}: {exc}")
    return Reading("ok", _build(f"--kube-proxy-config {path}", values, config_file=path))


# --- the process table ----------------------------------------------------------------------


def _os_error(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _netns_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


@dataclass(frozen=True)
class _Proc:
    pid: int
    argv: tuple[str, ...]
    same_netns: bool | None  # None when the namespace could not be read


def find_processes(proc: Path = Path("/proc")) -> tuple[list[_Proc], int]:
    """kube-proxy processes that may program this network namespace, and how many others
    (in other namespaces) were seen."""
    mine = _netns_id(str(proc / "self/ns/net"))
    found: list[_Proc] = []
    elsewhere = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # gone, or a kernel thread
        argv = tuple(a.decode("utf-8", "replace") for a in raw.split(b"\0") if a)
        if not is_kube_proxy(argv):
            continue
        theirs = _netns_id(str(entry / "ns/net"))
        same = None if theirs is None or mine is None else theirs == mine
        if same is False:
            elsewhere += 1
            continue
        found.append(_Proc(int(entry.name), argv, same))
    found.sort(key=lambda p: p.pid)
    return found, elsewhere


def _in_process(pid: int, path: str, proc: Path) -> Path:
    # The file lives in kube-proxy's mount namespace: reach it through /proc/PID/root.
    base = proc / str(pid) / "root"
    if not path.startswith("/"):
        base = proc / str(pid) / "cwd"
    return base / path.lstrip("/")


def read_process(proc: Path = Path("/proc")) -> Reading[KubeProxyConfig | None]:
    """kube-proxy's flags and --config file, from the process table."""
    try:
        found, elsewhere = find_processes(proc)
    except OSError as exc:
        return Reading("error", None, f"cannot list {proc}: {_os_error(exc)}")
    if not found:
        other = f" ({elsewhere} in other network namespaces)" if elsewhere else ""
        return Reading(
            "absent",
            None,
            f"no kube-proxy process sharing this network namespace in {proc}{other}: the "
            "agent's pod needs hostPID: true, or pass --kube-proxy-config FILE",
        )
    p = found[0]
    where = f"pid {p.pid}"
    origin = f"kube-proxy pid {p.pid} ({proc}/{p.pid}/cmdline)"
    if len(found) > 1:
        origin += f"; {len(found) - 1} more kube-proxy processes ignored"
    if p.same_netns is None:
        origin += "; its network namespace could not be read (needs CAP_SYS_PTRACE)"
    flags = parse_flags(p.argv)
    try:
        from_flags = _from_flags(flags, where)
    except ConfigError as exc:
        return Reading("error", None, f"cannot read kube-proxy's flags ({where}): {exc}")
    config = flags.get("config")
    extra: dict[str, Any] = {"pid": p.pid, "cmdline": p.argv}
    if not config:
        return Reading("ok", _build(origin, from_flags, **extra))
    on_disk = _in_process(p.pid, config, proc)
    # kube-proxy ignores every flag but logging ones when --config is given
    ignored = tuple(f"--{n}" for n in flags if n != "config")
    partial = _build(origin, {}, config_file=config, ignored_flags=ignored, **extra)
    try:
        text = on_disk.read_text()
    except OSError as exc:
        hint = (
            " (the agent needs CAP_SYS_PTRACE to read another container's files, or pass "
            "--kube-proxy-config FILE)"
            if isinstance(exc, PermissionError)
            else ""
        )
        return Reading(
            "error", partial, f"cannot read kube-proxy's --config {on_disk}: {_os_error(exc)}{hint}"
        )
    try:
        values = settings(parse_config_text(text), f"{config} ({where})")
    except (ConfigError, UnicodeDecodeError) as exc:
        return Reading("error", partial, f"cannot parse kube-proxy's --config {on_disk}: {exc}")
    return Reading("ok", _build(origin, values, config_file=config, ignored_flags=ignored, **extra))


def read(config_file: str | None = None) -> Reading[KubeProxyConfig | None]:
    return read_file(config_file) if config_file else read_process()


# --- primary node IP hints ------------------------------------------------------------------

# Documentation addresses (TEST-NET-1, 2001:db8::/32): the route lookup only asks the kernel which
# source address it would use towards the default route; nothing is sent.
_PROBE_DST = {"ipv4": "192.0.2.1", "ipv6": "2001:db8::1"}


def route_sources() -> dict[str, str]:
    """family -> the source address of this namespace's default route (RTM_GETROUTE)."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    out: dict[str, str] = {}
    try:
        with IPRoute() as ipr:
            for fam, dst in _PROBE_DST.items():
                af = socket.AF_INET6 if fam == "ipv6" else socket.AF_INET
                try:
                    msgs = ipr.route("get", dst=dst, family=af)
                except (NetlinkError, OSError):
                    continue  # no route for this family
                for m in msgs:
                    src = m.get_attr("RTA_PREFSRC")
                    if src:
                        out[fam] = str(src)
                        break
    except OSError:
        return out
    return out
