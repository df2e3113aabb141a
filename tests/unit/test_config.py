"""Agent configuration (lbagent.config): defaults, unknown keys, listen addresses, the token file."""

from __future__ import annotations

import grp
import pwd
import socket
from pathlib import Path

import pytest

from lbagent.config import DEFAULT_MAX_BODY_BYTES, MIN_TOKEN_LENGTH, Config, load_config, parse_listen
from lbagent.errors import ConfigError, LbAgentError

# The accounts this host is said to have: (name, uid, gid) and gid -> group name.
USERS = {"lbagent-haproxy": (999, 995), "www": (33, 33)}
GROUPS = {995: "lbagent-haproxy", 33: "www-data", 65534: "nogroup"}


@pytest.fixture(autouse=True)
def accounts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test sees the same accounts, whatever this host has."""

    def getpwnam(name: str) -> pwd.struct_passwd:
        uid, gid = USERS[name]
        return pwd.struct_passwd((name, "x", uid, gid, "", "/nonexistent", "/usr/sbin/nologin"))

    def group(gid: int) -> grp.struct_group:
        return grp.struct_group((GROUPS[gid], "x", gid, []))

    def getgrnam(name: str) -> grp.struct_group:
        return group({v: k for k, v in GROUPS.items()}[name])

    monkeypatch.setattr(pwd, "getpwnam", getpwnam)
    monkeypatch.setattr(grp, "getgrgid", group)
    monkeypatch.setattr(grp, "getgrnam", getgrnam)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("s3cret-token-of-the-tests\n")
    return path


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "lbagent.toml"
    path.write_text(text)
    return path


def test_defaults(tmp_path: Path, token_file: Path) -> None:
    config = load_config(write_config(tmp_path, f'[api]\ntoken_file = "{token_file}"\n'))
    assert config.agent.host == socket.gethostname()
    assert config.agent.state_dir == Path("/var/lib/lbagent")
    assert config.agent.run_dir == Path("/run/lbagent")
    assert config.agent.resync_interval == 30
    assert config.agent.gc_max_deletions_per_pass == 50
    assert (config.agent.log_format, config.agent.log_level) == ("text", "info")
    assert config.agent.inner_prefix6 == "fd4c:4241::/48"
    assert config.agent.size_neighbour_tables is True and config.agent.probe_traffic is True
    assert config.api.listen == "127.0.0.1:9680"
    assert (config.api.address.host, config.api.address.port) == ("127.0.0.1", 9680)
    assert config.api.max_body_bytes == DEFAULT_MAX_BODY_BYTES == 16 * 1024 * 1024
    assert config.api.tls_cert_file is None and config.api.tls_key_file is None
    assert config.ovs.db == "unix:/var/run/openvswitch/db.sock"
    assert config.ovs.integration_bridge == "br-int"
    assert config.haproxy.binary == "haproxy"
    assert config.haproxy.prometheus_listen == "" and config.haproxy.prometheus_address is None
    assert config.read_token() == "s3cret-token-of-the-tests"
    assert config.haproxy_options() == {
        "prometheus_listen": "",
        "default_listener_maxconn": 10_000,
        "user": "lbagent-haproxy",
        "group": "lbagent-haproxy",  # the user's own
        "chroot": Path("/run/lbagent/haproxy/chroot"),
    }


def test_every_key_set(tmp_path: Path, token_file: Path) -> None:
    config = load_config(
        write_config(
            tmp_path,
            f"""
            [agent]
            host = "gw-1"
            state_dir = "{tmp_path}/state"
            run_dir = "{tmp_path}/run"
            resync_interval = 2.5
            gc_max_deletions_per_pass = 5
            log_format = "json"
            log_level = "debug"

            [api]
            listen = "[::1]:9000"
            token_file = "{token_file}"
            max_body_bytes = 1024
            tls_cert_file = "/etc/lbagent/tls.crt"
            tls_key_file = "/etc/lbagent/tls.key"

            [ovs]
            db = "tcp:127.0.0.1:6640"
            integration_bridge = "br-test"

            [haproxy]
            binary = "/usr/sbin/haproxy"
            prometheus_listen = "127.0.0.1:9101"
            user = "www"
            group = "nogroup"
            chroot = "/var/empty"
            default_listener_maxconn = 500
            """,
        )
    )
    assert config.agent.host == "gw-1"
    assert config.agent.state_dir == tmp_path / "state"
    assert config.agent.resync_interval == 2.5
    assert (config.api.address.host, config.api.address.port) == ("::1", 9000)
    assert config.api.tls_key_file == Path("/etc/lbagent/tls.key")
    assert config.haproxy.prometheus_address is not None and config.haproxy.prometheus_address.port == 9101
    options = config.haproxy_options()
    assert (options["user"], options["group"], options["chroot"]) == ("www", "nogroup", Path("/var/empty"))
    assert options["default_listener_maxconn"] == 500


def test_chroot_defaults_under_the_run_dir_and_empty_turns_it_off(tmp_path: Path) -> None:
    unix = f'[api]\nlisten = "unix:{tmp_path}/api.sock"\n'
    config = load_config(write_config(tmp_path, f'[agent]\nrun_dir = "{tmp_path}/run"\n{unix}'))
    assert config.haproxy_options()["chroot"] == tmp_path / "run" / "haproxy" / "chroot"
    config = load_config(write_config(tmp_path, f'{unix}[haproxy]\nchroot = ""\nuser = ""\n'))
    options = config.haproxy_options()
    assert (options["user"], options["group"], options["chroot"]) == ("", "", None)


def test_a_missing_haproxy_user_is_named_at_load(tmp_path: Path) -> None:
    path = write_config(tmp_path, f'[api]\nlisten = "unix:{tmp_path}/api.sock"\n[haproxy]\nuser = "nosuchuser"\n')
    with pytest.raises(ConfigError, match=r"haproxy\.user 'nosuchuser' does not exist.*useradd --system"):
        load_config(path)


def test_a_missing_haproxy_group_is_named_at_load(tmp_path: Path) -> None:
    path = write_config(tmp_path, f'[api]\nlisten = "unix:{tmp_path}/api.sock"\n[haproxy]\ngroup = "nosuchgroup"\n')
    with pytest.raises(ConfigError, match=r"haproxy\.group 'nosuchgroup' does not exist"):
        load_config(path)


@pytest.mark.parametrize(
    ("section", "line", "message"),
    [
        ("haproxy", 'user = "Root Me"', r"invalid haproxy\.user .*user or group name"),
        ("haproxy", 'user = "-u"', r"invalid haproxy\.user"),
        ("haproxy", 'user = ""\ngroup = "nogroup"', r"group needs a user"),
        ("haproxy", 'chroot = "jail"', r"invalid haproxy\.chroot .*absolute"),
        ("haproxy", "default_listener_maxconn = 0", r"invalid haproxy\.default_listener_maxconn"),
        ("haproxy", "default_listener_maxconn = 1000001", r"invalid haproxy\.default_listener_maxconn"),
        ("ovn", 'nb = "ssl:198.19.255.1:6641"', r"invalid ovn\.nb .*unix:/PATH"),
        ("ovn", 'nb = "198.19.255.1"', r"invalid ovn\.nb"),
        ("ovn", "lease_seconds = 0.1", r"invalid ovn\.lease_seconds"),
        ("ovn", "restart_grace = -1", r"invalid ovn\.restart_grace"),
    ],
)
def test_bad_keys_of_a_section(tmp_path: Path, section: str, line: str, message: str) -> None:
    path = write_config(tmp_path, f'[api]\nlisten = "unix:{tmp_path}/api.sock"\n[{section}]\n{line}\n')
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def agent_config(tmp_path: Path, line: str) -> Path:
    return write_config(tmp_path, f'[api]\nlisten = "unix:{tmp_path}/api.sock"\n[agent]\n{line}\n')


def test_inner_prefix6_is_kept_in_its_canonical_spelling(tmp_path: Path) -> None:
    config = load_config(agent_config(tmp_path, 'inner_prefix6 = "FD00:0:0:7::/64"'))
    assert config.agent.inner_prefix6 == "fd00:0:0:7::/64"


def test_inner_prefix6_must_be_a_unique_local_prefix_with_room_for_the_pairs(tmp_path: Path) -> None:
    reasons = {
        "169.254.0.0/16": "IPv6 prefix",
        "fd4c:4241::1/48": "host bits",
        "2001:db8::/48": "unique local",
        "fd00::/40": "/48 to /112",
        "fd00::/120": "/48 to /112",
    }
    for value, reason in reasons.items():
        with pytest.raises(ConfigError, match=rf"invalid agent\.inner_prefix6 .*{reason}"):
            load_config(agent_config(tmp_path, f'inner_prefix6 = "{value}"'))


def test_the_ovn_section_configures_high_availability(tmp_path: Path) -> None:
    assert Config().ovn.nb == ""  # no high availability by default
    text = (
        f'[api]\nlisten = "unix:{tmp_path}/api.sock"\n[ovn]\nnb = "tcp:198.19.255.1:6641,tcp:198.19.255.2:6641"\n'
        'chassis = "gw-1-chassis"\nlease_seconds = 2\nrestart_grace = 60.0\n'
    )
    ovn = load_config(write_config(tmp_path, text)).ovn
    assert (ovn.nb, ovn.chassis, ovn.lease_seconds, ovn.restart_grace) == (
        "tcp:198.19.255.1:6641,tcp:198.19.255.2:6641",
        "gw-1-chassis",
        2.0,
        60.0,
    )


def test_unknown_key_is_named(tmp_path: Path, token_file: Path) -> None:
    path = write_config(tmp_path, f'[agent]\nstat_dir = "/x"\n[api]\ntoken_file = "{token_file}"\n')
    with pytest.raises(ConfigError, match=rf"unknown key agent\.stat_dir in {path}"):
        load_config(path)


def test_unknown_section_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key haproxxy in"):
        load_config(write_config(tmp_path, '[api]\nlisten = "unix:/run/lbagent.sock"\n[haproxxy]\n'))


def test_every_problem_is_listed(tmp_path: Path) -> None:
    text = (
        '[agent]\nresync_interval = 0\nlog_level = "loud"\n[api]\nlisten = "unix:/run/x.sock"\nmax_body_bytes = "1"\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_config(write_config(tmp_path, text))
    message = str(caught.value)
    for key in ("agent.resync_interval", "agent.log_level", "api.max_body_bytes"):
        assert f"invalid {key}" in message


@pytest.mark.parametrize(
    "listen",
    [
        "9680",
        "127.0.0.1",
        "127.0.0.1:0",
        "127.0.0.1:70000",
        "unix:run/x",
        "a b:1",
        "[nope]:1",
        "999.0.0.1:80",
        "127.0.0.1:80x",
    ],
)
def test_bad_listen(tmp_path: Path, token_file: Path, listen: str) -> None:
    path = write_config(tmp_path, f'[api]\nlisten = "{listen}"\ntoken_file = "{token_file}"\n')
    with pytest.raises(ConfigError, match=r"invalid api\.listen"):
        load_config(path)


def test_tcp_listener_needs_a_token_file(tmp_path: Path) -> None:
    missing = tmp_path / "no-token"
    with pytest.raises(ConfigError, match="token_file .*no-token"):
        load_config(write_config(tmp_path, f'[api]\ntoken_file = "{missing}"\n'))


def test_tcp_listener_needs_a_non_empty_token(tmp_path: Path) -> None:
    empty = tmp_path / "token"
    empty.write_text("  \n")
    with pytest.raises(ConfigError, match="missing or empty"):
        load_config(write_config(tmp_path, f'[api]\ntoken_file = "{empty}"\n'))


@pytest.mark.parametrize("token", ["s3cret", "x" * (MIN_TOKEN_LENGTH - 1)])
def test_short_token_is_refused_without_showing_it(tmp_path: Path, token: str) -> None:
    short = tmp_path / "token"
    short.write_text(token + "\n")
    with pytest.raises(ConfigError, match=f"{len(token)} characters.*at least {MIN_TOKEN_LENGTH}") as raised:
        load_config(write_config(tmp_path, f'[api]\ntoken_file = "{short}"\n'))
    assert token not in str(raised.value)


def test_token_of_the_minimum_length_is_taken(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(" " + "x" * MIN_TOKEN_LENGTH + " \n")  # surrounding blanks do not count
    config = load_config(write_config(tmp_path, f'[api]\ntoken_file = "{token_file}"\n'))
    assert config.read_token() == "x" * MIN_TOKEN_LENGTH


def test_unix_listener_needs_no_token(tmp_path: Path) -> None:
    config = load_config(
        write_config(tmp_path, f'[api]\nlisten = "unix:{tmp_path}/api.sock"\ntoken_file = "{tmp_path}/none"\n')
    )
    assert config.api.address.is_unix and config.api.address.path == tmp_path / "api.sock"
    assert config.read_token() is None


def test_tls_files_go_together(tmp_path: Path, token_file: Path) -> None:
    path = write_config(tmp_path, f'[api]\ntoken_file = "{token_file}"\ntls_cert_file = "/etc/tls.crt"\n')
    with pytest.raises(ConfigError, match="together"):
        load_config(path)


def test_relative_paths_are_rejected(tmp_path: Path, token_file: Path) -> None:
    path = write_config(tmp_path, f'[agent]\nstate_dir = "state"\n[api]\ntoken_file = "{token_file}"\n')
    with pytest.raises(ConfigError, match=r"invalid agent\.state_dir .*absolute"):
        load_config(path)


def test_wrong_types_are_rejected(tmp_path: Path, token_file: Path) -> None:
    path = write_config(tmp_path, f'[agent]\ngc_max_deletions_per_pass = 1.5\n[api]\ntoken_file = "{token_file}"\n')
    with pytest.raises(ConfigError, match=r"invalid agent\.gc_max_deletions_per_pass"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"invalid agent in .*must be a table"):
        load_config(write_config(tmp_path, 'agent = 5\n[api]\nlisten = "unix:/run/x.sock"\n'))


def test_missing_explicit_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.toml")


def test_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(LbAgentError, match="not valid TOML"):
        load_config(write_config(tmp_path, "[agent\n"))


def test_no_file_means_defaults_with_the_token_check() -> None:
    if Path("/etc/lbagent/token").exists():
        assert isinstance(load_config(None), Config)
    else:
        with pytest.raises(ConfigError, match="/etc/lbagent/token"):
            load_config(None)


def test_parse_listen() -> None:
    assert parse_listen("localhost:80").host == "localhost"
    assert parse_listen("unix:/run/lbagent/api.sock").path == Path("/run/lbagent/api.sock")
    with pytest.raises(ValueError):
        parse_listen("unix:/run/x.sock", allow_unix=False)
