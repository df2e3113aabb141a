"""Agent configuration: the TOML file of api.md ("Configuration and command line").

Owns the schema and defaults of every key, reading the file, and the checks
that let a misconfigured agent fail at start instead of at its first request:
unknown keys, the listen address, the bearer token of a TCP listener (present,
at least MIN_TOKEN_LENGTH characters), the
TLS certificate/key pair and the account haproxy's workers run as. Every key is optional; load_config(None) gives the
defaults.
"""

from __future__ import annotations

import grp
import ipaddress
import pwd
import re
import socket
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, ValidationError, model_validator

from lbagent.desired.details import clean_message, preview
from lbagent.desired.fields import Hostname, InterfaceName, check_hostname, parse_ipv4
from lbagent.errors import ConfigError
from lbagent.haproxy.capacity import DEFAULT_LISTENER_MAXCONN
from lbagent.haproxy.files import HaproxyPaths

DEFAULT_CONFIG_PATH = Path("/etc/lbagent/lbagent.toml")
DEFAULT_LISTEN = "127.0.0.1:9680"
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
# A bearer token shorter than this is guessable, and most likely a placeholder.
MIN_TOKEN_LENGTH = 16


@dataclass(frozen=True)
class ListenAddress:
    """A parsed "HOST:PORT" or "unix:/PATH"; exactly one of `path` and `host`/`port` is set."""

    path: Path | None = None
    host: str | None = None
    port: int | None = None

    @property
    def is_unix(self) -> bool:
        return self.path is not None


def parse_listen(value: str, *, allow_unix: bool = True) -> ListenAddress:
    """Parse "HOST:PORT" (HOST an IPv4 address, [IPv6] or a name) or "unix:/PATH"."""
    if value.startswith("unix:"):
        path = Path(value.removeprefix("unix:"))
        if not allow_unix:
            raise ValueError("must be HOST:PORT")
        if not path.is_absolute():
            raise ValueError("must be unix:/ABSOLUTE/PATH")
        return ListenAddress(path=path)
    host, sep, port = value.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError('must be "HOST:PORT" with a port 1-65535' + (' or "unix:/PATH"' if allow_unix else ""))
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError("must have a valid IPv6 address inside [ ]") from None
        return ListenAddress(host=host[1:-1], port=int(port))
    try:
        if re.fullmatch(r"[0-9.]+", host):
            parse_ipv4(host)
        else:
            check_hostname(host)
    except ValueError:
        raise ValueError("must name a host: an IPv4 address, [IPv6 address] or host name before the ':'") from None
    return ListenAddress(host=host, port=int(port))


def _absolute(path: Path) -> Path:
    # The agent runs from systemd with / as its working directory; a relative
    # path would silently mean something else in a test or a shell.
    if not path.is_absolute():
        raise ValueError("must be an absolute path")
    return path


def _listen(value: str) -> str:
    parse_listen(value)
    return value


def _tcp_listen_or_empty(value: str) -> str:
    if value:
        parse_listen(value, allow_unix=False)
    return value


def _absolute_or_empty(value: str) -> str:
    if value:
        _absolute(Path(value))
    return value


def _account_or_empty(value: str) -> str:
    # Debian's rule for user and group names (adduser's NAME_REGEX), which is
    # also one word of haproxy's configuration.
    if value and not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", value):
        raise ValueError("must be a user or group name: lower-case letters, digits, '_' and '-', at most 32")
    return value


_OVSDB_REMOTE = r"unix:/.+|(?:tcp|ssl):.+:[0-9]{1,5}"


def _ovsdb_remote(value: str) -> str:
    if not re.fullmatch(_OVSDB_REMOTE, value):
        raise ValueError('must be an OVSDB remote: "unix:/PATH", "tcp:HOST:PORT" or "ssl:HOST:PORT"')
    return value


def _plain_remotes_or_empty(value: str) -> str:
    # The members of a clustered database, comma-separated, as ovn-nbctl takes
    # them; no ssl: the agent has no keys to offer, and would never connect.
    if value and not all(re.fullmatch(r"unix:/.+|tcp:.+:[0-9]{1,5}", part.strip()) for part in value.split(",")):
        raise ValueError('must be "" or OVSDB remotes separated by commas: "unix:/PATH" or "tcp:HOST:PORT"')
    return value


# The agent's own IPv6 prefix for the inner/outer pairs, the twin of 169.254/16:
# unique local (never routed beyond a site), and room for every load balancer's pair.
DEFAULT_INNER_PREFIX6 = "fd4c:4241::/48"
_UNIQUE_LOCAL = ipaddress.IPv6Network("fc00::/7")
MIN_INNER_PREFIX6_LEN, MAX_INNER_PREFIX6_LEN = 48, 112


def _inner_prefix6(value: str) -> str:
    try:
        network = ipaddress.IPv6Network(value)
    except ValueError:
        raise ValueError("must be an IPv6 prefix without host bits, like fd4c:4241::/48") from None
    if not network.subnet_of(_UNIQUE_LOCAL):
        raise ValueError(f"must be a unique local prefix (inside {_UNIQUE_LOCAL}): it is never routed off the host")
    if not MIN_INNER_PREFIX6_LEN <= network.prefixlen <= MAX_INNER_PREFIX6_LEN:
        raise ValueError(f"must be a /{MIN_INNER_PREFIX6_LEN} to /{MAX_INNER_PREFIX6_LEN}")
    return str(network)


AbsolutePath = Annotated[Path, AfterValidator(_absolute)]
NonEmptyStr = Annotated[str, Strict(), Field(min_length=1)]


class _Section(BaseModel):
    # forbid: api.md wants an unknown key to be an error naming it.
    model_config = ConfigDict(extra="forbid", frozen=True)


DEFAULT_RESYNC_RATE = 8.0  # resync passes per second, all load balancers together


class AgentSection(_Section):
    host: Hostname = Field(default_factory=socket.gethostname)
    state_dir: AbsolutePath = Path("/var/lib/lbagent")
    run_dir: AbsolutePath = Path("/run/lbagent")
    resync_interval: Annotated[float, Strict(), Field(gt=0)] = 30.0  # seconds, jittered
    # At most this many resync passes a second over all load balancers: with
    # more than resync_interval * resync_rate of them, each is resynced less often.
    resync_rate: Annotated[float, Strict(), Field(gt=0)] = DEFAULT_RESYNC_RATE
    gc_max_deletions_per_pass: Annotated[int, Strict(), Field(ge=1)] = 50
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    inner_prefix6: Annotated[str, Strict(), AfterValidator(_inner_prefix6)] = DEFAULT_INNER_PREFIX6
    # Raise the kernel's neighbour table limits to what the load balancers need (never lower them).
    size_neighbour_tables: Annotated[bool, Strict()] = True
    # A load balancer is ready once its gateway answers ARP through its OVN port, not on ovn-installed alone.
    probe_traffic: Annotated[bool, Strict()] = True


class ApiSection(_Section):
    listen: Annotated[str, Strict(), AfterValidator(_listen)] = DEFAULT_LISTEN
    token_file: AbsolutePath = Path("/etc/lbagent/token")
    max_body_bytes: Annotated[int, Strict(), Field(ge=1)] = DEFAULT_MAX_BODY_BYTES
    tls_cert_file: AbsolutePath | None = None
    tls_key_file: AbsolutePath | None = None

    @model_validator(mode="after")
    def check_tls_pair(self) -> ApiSection:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file must be given together")
        return self

    @property
    def address(self) -> ListenAddress:
        return parse_listen(self.listen)


class OvsSection(_Section):
    db: Annotated[str, Strict(), AfterValidator(_ovsdb_remote)] = "unix:/var/run/openvswitch/db.sock"
    integration_bridge: InterfaceName = "br-int"


class OvnSection(_Section):
    nb: Annotated[str, Strict(), AfterValidator(_plain_remotes_or_empty)] = ""  # "": no high availability
    chassis: Annotated[str, Strict(), Field(max_length=255)] = ""  # "": Open_vSwitch external_ids:system-id
    lease_seconds: Annotated[float, Strict(), Field(ge=0.3, le=60)] = 1.5
    # How long standbys wait for an agent that stops (a restart) before taking its leases.
    restart_grace: Annotated[float, Strict(), Field(ge=0, le=600)] = 30.0


DEFAULT_HAPROXY_USER = "lbagent-haproxy"
MAX_LISTENER_MAXCONN = 1_000_000
Account = Annotated[str, Strict(), AfterValidator(_account_or_empty)]


class HaproxySection(_Section):
    binary: NonEmptyStr = "haproxy"  # a name looked up in PATH, or a path
    prometheus_listen: Annotated[str, Strict(), AfterValidator(_tcp_listen_or_empty)] = ""  # "" is off
    user: Account = DEFAULT_HAPROXY_USER  # the workers' account; "" keeps them root
    group: Account = ""  # "": the user's own group
    # The workers' root directory; None: <run_dir>/haproxy/chroot, "": none.
    chroot: Annotated[str, Strict(), AfterValidator(_absolute_or_empty)] | None = None
    default_listener_maxconn: Annotated[int, Strict(), Field(ge=1, le=MAX_LISTENER_MAXCONN)] = DEFAULT_LISTENER_MAXCONN

    @model_validator(mode="after")
    def check_group_has_user(self) -> HaproxySection:
        if self.group and not self.user:
            raise ValueError("group needs a user: without one the workers stay root")
        return self

    @property
    def prometheus_address(self) -> ListenAddress | None:
        return parse_listen(self.prometheus_listen, allow_unix=False) if self.prometheus_listen else None


class Config(_Section):
    agent: AgentSection = Field(default_factory=AgentSection)
    api: ApiSection = Field(default_factory=ApiSection)
    ovs: OvsSection = Field(default_factory=OvsSection)
    ovn: OvnSection = Field(default_factory=OvnSection)
    haproxy: HaproxySection = Field(default_factory=HaproxySection)

    def read_token(self) -> str | None:
        """The API bearer token, stripped; None when the token file does not exist or is empty.

        ConfigError if it is shorter than MIN_TOKEN_LENGTH (the message says how
        long it is, never what it is)."""
        try:
            token = self.api.token_file.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read api.token_file {self.api.token_file}: {exc}") from None
        if token and len(token) < MIN_TOKEN_LENGTH:
            raise ConfigError(
                f"api.token_file {self.api.token_file} holds a token of {len(token)} characters;"
                f" it must have at least {MIN_TOKEN_LENGTH} (e.g. head -c 32 /dev/urandom | base64)"
            )
        return token or None

    def haproxy_accounts(self) -> tuple[str, str]:
        """(user, group) haproxy's workers run as, ("", "") for root; ConfigError if either does not exist."""
        user, group = self.haproxy.user, self.haproxy.group
        if not user:
            return "", ""
        try:
            gid = pwd.getpwnam(user).pw_gid
        except KeyError:
            raise ConfigError(
                f"haproxy.user {user!r} does not exist on this host: create it (make deps does:"
                f" useradd --system --no-create-home --shell /usr/sbin/nologin {user}),"
                ' or set user = "" to run haproxy\'s workers as root'
            ) from None
        try:
            return user, grp.getgrnam(group).gr_name if group else grp.getgrgid(gid).gr_name
        except KeyError:
            raise ConfigError(f"haproxy.group {group or gid!r} does not exist on this host") from None

    def haproxy_options(self) -> dict[str, Any]:
        """The keyword arguments of HaproxyManager for this configuration."""
        user, group = self.haproxy_accounts()
        return {
            "prometheus_listen": self.haproxy.prometheus_listen,
            "default_listener_maxconn": self.haproxy.default_listener_maxconn,
            "user": user,
            "group": group,
            "chroot": self.haproxy_chroot,
        }

    @property
    def haproxy_chroot(self) -> Path | None:
        chroot = self.haproxy.chroot
        if chroot is None:
            return HaproxyPaths(self.agent.run_dir).chroot_dir
        return Path(chroot) if chroot else None


def _describe(error: Any, source: str) -> str:
    key = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"unknown key {key} in {source}"
    if error["type"] in ("model_type", "dict_type"):
        message = "must be a table"
    else:
        message = clean_message(error["msg"])
    if not isinstance(error["input"], dict):
        message = f"{message} (got {preview(error['input'])})"
    return f"invalid {key or 'file'} in {source}: {message}"


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def load_config(path: Path | None) -> Config:
    """Read and check the configuration at `path`; None means every default.

    A TCP API listener needs a readable, non-empty token file at load time
    (api.md: "required for a TCP listener"); a unix socket relies on its file mode.
    """
    data = _read_toml(path) if path is not None else {}
    source = str(path) if path is not None else "the built-in defaults"
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError("; ".join(_describe(error, source) for error in exc.errors())) from None
    if not config.api.address.is_unix and config.read_token() is None:
        raise ConfigError(
            f"api.token_file {config.api.token_file} is missing or empty; a TCP listener"
            f" ({config.api.listen}) needs a bearer token (or listen on unix:/PATH instead)"
        )
    config.haproxy_accounts()
    return config
