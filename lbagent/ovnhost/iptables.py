"""python-iptables, confined to one thread, converging the tables of a namespace.

libiptc keeps process-wide table handles with no locking, and a handle
remembers the namespace it was opened in. So every iptc call runs on the one
thread of an `iptc` NamespaceExecutor; a pass refreshes the handle after
entering the namespace, stages all changes with autocommit off, commits once
per table it changed (libiptc swaps the whole table: atomic) and closes the
handle before leaving. The nat table is always converged; the filter table
(UDP access lists) only while a rule wants it or it exists, so that a
namespace without access lists never gets one, and it is committed first: a
listener's access list is in force before the rules that open the listener.
The IPv6 tables (a dual-stack load balancer's family-6 rules) are converged
like the filter table, only while a rule wants them or they exist, so an
IPv4-only namespace never gets ip6tables state; the filter tables of both
families go before the nat tables.
What reads without libiptc (the table's digest, `nat_state`) may run on any
namespace thread.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from lbagent.metrics import count_write
from lbagent.ovnhost.errors import IptablesError
from lbagent.ovnhost.iptc_import import iptc
from lbagent.ovnhost.iptdigest import present_tables, table_digest
from lbagent.ovnhost.nat import (
    HMARK_SEED,
    PRE_CHAIN,
    TABLE_HOOKS,
    Family,
    NatRule,
    backend_key_from_comment,
    comment_hash,
)

if TYPE_CHECKING:
    from lbagent.ovnhost.netns import NamespaceExecutor

COMMIT_ATTEMPTS = 3
HOST_PREFIX = {4: "32", 6: "128"}  # HMARK hashes the whole source address
HMARK_SOURCE_ONLY = (
    ("hmark-dst-prefix", "0"),
    ("hmark-sport-mask", "0"),
    ("hmark-dport-mask", "0"),
    ("hmark-proto-mask", "0"),
)


class TableId(NamedTuple):
    family: Family
    name: str

    def __str__(self) -> str:
        return f"{'ip6tables' if self.family == 6 else 'iptables'} {self.name}"


NAT = TableId(4, "nat")
# The order of a pass: access lists (filter) before the rules that open listeners (nat).
TABLE_ORDER = (TableId(4, "filter"), TableId(6, "filter"), NAT, TableId(6, "nat"))


# Extension libraries that hold separate IPv4 and IPv6 variants of a target,
# with the target that tells whether a family's variants are registered.
DUAL_FAMILY_EXTENSIONS = {"libxt_NAT.so": "DNAT", "libxt_HMARK.so": "HMARK"}
_NFPROTO = {4: iptc.xtables.NFPROTO_IPV4, 6: iptc.xtables.NFPROTO_IPV6}
_extensions_loaded = False
_private_copies: list[int] = []  # descriptors of the libraries loaded a second time


def load_extensions_for_both_families() -> None:
    """Register the IPv4 and the IPv6 variants of the targets the agent writes.

    libxtables registers, when it loads an extension library, only the
    variants of the family current at that moment; a library already loaded
    is not loaded again for the other family, so whichever family built a
    DNAT, SNAT or HMARK rule first is the only one that ever can ("can't find
    target DNAT"; python-iptables' fallback of calling the library's init
    again aborts the process on the structures already registered). A second
    copy of the library, loaded from its own path while the other family is
    current, registers that family's variants from structures of its own.
    This works only before any rule used the library, so it runs once, before
    the first table is opened or rule built; a library found already loaded
    for either family is left as it is."""
    global _extensions_loaded
    if _extensions_loaded:
        return
    _extensions_loaded = True
    xtables = iptc.xtables.xtables
    for library, target in DUAL_FAMILY_EXTENSIONS.items():
        path = os.path.join(iptc.xtables._xtables_libdir or "", library)
        # (an iptables with a library per family, libipt_X and libip6t_X, needs no copy)
        if not os.path.exists(path) or any(_target_registered(family, target) for family in (4, 6)):
            continue
        xtables(_NFPROTO[4]).find_target(target)  # the library itself, for IPv4
        # The copy lives in memory (no file system that might be noexec), and
        # its descriptor stays open: the dynamic loader knows a library by its
        # path, and a reused descriptor number would name the previous copy.
        copy = os.memfd_create(library, os.MFD_CLOEXEC)
        _private_copies.append(copy)
        with open(path, "rb") as original:
            with open(f"/proc/self/fd/{copy}", "wb") as written:
                written.write(original.read())
        xtables._xtables_set_nfproto(_NFPROTO[6])
        ctypes.CDLL(f"/proc/self/fd/{copy}")  # its constructor registers the IPv6 variants


def _target_registered(family: Family, target: str) -> bool:
    """Whether libxtables knows `target` for `family`, without loading anything."""
    iptc.xtables.xtables._xtables_set_nfproto(_NFPROTO[family])
    return bool(iptc.xtables.xtables._xtables_find_target(target.encode(), iptc.xtables.XTF_DONT_LOAD))


def _present() -> set[TableId]:
    return {TableId(family, name) for family in (4, 6) for name in present_tables(family)}


def sync_nat(rules: list[NatRule]) -> int:
    """Make the agent's rules in this namespace's tables exactly `rules`.

    Only rules with our hash comments are touched in the built-in chains; our
    own chains are ours entirely. Returns the number of rules changed.
    """
    changes = 0
    for table_id in _tables_to_converge(map(_table_of, rules), _present()):
        changes += _sync_table(table_id, [rule for rule in rules if _table_of(rule) == table_id])
    return changes


def _table_of(rule: NatRule) -> TableId:
    return TableId(rule.family, rule.table)


def _tables_to_converge(wanted: Iterable[TableId], present: set[TableId]) -> list[TableId]:
    """The filter tables before the nat tables; a table other than IPv4's nat
    only if a rule wants it or it exists (to take our rules out again)."""
    wanted = set(wanted)
    return [table_id for table_id in TABLE_ORDER if table_id == NAT or table_id in wanted or table_id in present]


def _sync_table(table_id: TableId, rules: list[NatRule]) -> int:
    for attempt in range(COMMIT_ATTEMPTS):
        table = _table(table_id)
        try:
            table.refresh()
            changes = _stage(table, table_id.name, rules)
            if changes:
                table.commit()
                count_write("iptables", changes, what=f"commit {table_id} table ({changes} rule changes)")
            return changes
        except iptc.IPTCError as exc:
            # A concurrent writer makes commit fail with EAGAIN: start over.
            if attempt + 1 < COMMIT_ATTEMPTS and _is_eagain(exc):
                continue
            raise IptablesError(f"{table_id}: {exc}") from exc
        finally:
            _release(table)
    raise AssertionError("unreachable")


@dataclass(frozen=True, slots=True)
class WantedNat:
    """What `nat_state` needs of a set of rules: a digest of their hashes and the
    tables they are in. A load balancer's last pass is remembered by this
    rather than by its rules (2.5 kB of rule objects each)."""

    digest: str
    tables: frozenset[TableId]


_TABLE_SETS: dict[frozenset[TableId], frozenset[TableId]] = {}  # one object per combination of tables


def wanted_nat(rules: Iterable[NatRule]) -> WantedNat:
    rules = list(rules)
    digest = hashlib.sha256(repr(sorted((r.table, r.chain, r.hash) for r in rules)).encode()).hexdigest()
    tables = frozenset(map(_table_of, rules))
    return WantedNat(digest, _TABLE_SETS.setdefault(tables, tables))


def nat_state(rules: Sequence[NatRule] | WantedNat) -> str:
    """These rules (or what `wanted_nat` kept of them) and this namespace's
    tables as they are now, for the next pass to compare (`converge_nat`):
    the wanted rules' hashes and the digests of the tables a pass converges.
    It reads the kernel through a plain socket, not python-iptables, so any
    thread in the namespace may take it."""
    wanted = rules if isinstance(rules, WantedNat) else wanted_nat(rules)
    present = _present()
    # A table a rule wants but that does not exist yet is not read (reading it
    # would make it): its name alone stands for its absence.
    digests = [
        table_digest(table_id.name, table_id.family)
        if table_id == NAT or table_id in present
        else f"no {table_id.family} {table_id.name}"
        for table_id in _tables_to_converge(wanted.tables, present)
    ]
    return ":".join([wanted.digest, *digests])


def write_nat(rules: list[NatRule]) -> tuple[int, str]:
    """`sync_nat`, and the state it left, read at once on the same thread: an
    edit from outside a moment later must not pass for the agent's own."""
    return sync_nat(rules), nat_state(rules)


async def converge_nat(
    readers: NamespaceExecutor, writer: NamespaceExecutor, netns: str, rules: list[NatRule], last_state: str | None
) -> tuple[int, str]:
    """`write_nat` on the iptables thread (`writer`), unless the table is byte for
    byte what the last pass left for these same rules (`last_state`, as returned
    then). That check is read on `readers`: the iptables thread, which every
    load balancer's rules queue for, is left to the writes. Returns the number
    of rules changed and the state to hand to the next pass."""
    if last_state is not None and await readers.run(netns, nat_state, rules) == last_state:
        return 0, last_state
    return await writer.run(netns, write_nat, rules)


def observed_backend_ports() -> dict[str, int]:
    """Member key -> port on INNER (or INNER6), read back from the backend DNAT
    rules' tags in the nat tables of both families (IPv6's only if it exists:
    reading it would make it)."""
    ports: dict[str, int] = {}
    present = _present()
    for table_id in (NAT, TableId(6, "nat")):
        if table_id == NAT or table_id in present:
            ports.update(_backend_ports(table_id))
    return ports


def _backend_ports(table_id: TableId) -> dict[str, int]:
    table = _table(table_id)
    try:
        table.refresh()
        ports = {}
        if table.is_chain(PRE_CHAIN):
            for rule, _ in _hashed_rules(iptc.Chain(table, PRE_CHAIN)):
                comment = next(m.comment for m in rule.matches if m.name == "comment")
                key = backend_key_from_comment(comment)
                dport = next((m.dport for m in rule.matches if m.name == "tcp"), None)
                if key is not None and dport:
                    ports[key] = int(dport)
        return ports
    except iptc.IPTCError as exc:
        raise IptablesError(f"{table_id}: {exc}") from exc
    finally:
        _release(table)


def _table(table_id: TableId) -> iptc.Table:
    """python-iptables' handle of table `name`, the only one it may consult.

    To tell a jump to a chain from a target extension (HMARK, a chain name),
    python-iptables asks every table it believes exists whether the name is a
    chain there (`Rule.tables`), for the rules it builds and for those it reads
    back: a table it has not cached yet it opens then, in whatever namespace
    the thread is in, and never closes; one the agent has closed (`close()`
    leaves no handle) crashes the process. A jump goes to a chain of its own
    table, the one whose handle is open now, so that is the only table it is
    told about (IPv6 rules ask `Table6`, which is told alike)."""
    load_extensions_for_both_families()
    _declare_open(table_id)
    table_class = iptc.Table6 if table_id.family == 6 else iptc.Table
    return table_class(table_id.name, autocommit=False)


def _release(table: iptc.Table) -> None:
    """Close `table` and tell python-iptables no table exists any more: a rule
    built after the pass (bench/floor.py, tests) must not ask a closed handle
    whether a name is a chain, which crashes the process."""
    table.close()
    _declare_open(None)


def _declare_open(table_id: TableId | None) -> None:
    """Tell python-iptables that table `table_id` is the only one that exists, in
    either family (None: none does)."""
    for table_class in (iptc.Table, iptc.Table6):
        family = 6 if table_class is iptc.Table6 else 4
        table_class.existing_table_names.clear()
        table_class.existing_table_names.update(
            {name: table_id is not None and table_id == (family, name) for name in table_class.ALL}
        )


def _is_eagain(exc: Exception) -> bool:
    return "Resource temporarily unavailable" in str(exc) or getattr(exc, "errno", None) == errno.EAGAIN


def _stage(table: iptc.Table, table_name: str, rules: list[NatRule]) -> int:
    """Stage the changes that make `table` hold exactly `rules`. Our own chains
    exist while a rule lives in one or jumps to it: without access lists the
    filter table keeps no chain of ours."""
    hooks = TABLE_HOOKS[table_name]
    needed = {name for rule in rules for name in (rule.chain, rule.target) if name in hooks}
    changes = 0
    for chain_name in needed:
        if not table.is_chain(chain_name):
            table.create_chain(chain_name)
            changes += 1
    present = {name for name in hooks if name in needed or table.is_chain(name)}
    by_chain: dict[str, dict[str, NatRule]] = {}
    for rule in rules:
        by_chain.setdefault(rule.chain, {})[rule.hash] = rule
    for chain_name in set(by_chain) | present | set(hooks.values()):
        chain = iptc.Chain(table, chain_name)
        wanted = by_chain.get(chain_name, {})
        owned = chain_name in hooks
        seen: set[str] = set()
        for rule, rule_hash in list(_hashed_rules(chain, include_foreign=owned)):
            if rule_hash in wanted and rule_hash not in seen:
                seen.add(rule_hash)
                continue
            chain.delete_rule(rule)  # unknown hash, duplicate, or foreign rule in our chain
            changes += 1
        for rule_hash, rule in wanted.items():
            if rule_hash not in seen:
                table.append_entry(chain_name, rule_entry(rule))
                changes += 1
    for chain_name in present - needed:  # emptied above, and the jumps to it gone
        table.delete_chain(chain_name)
        changes += 1
    return changes


def _hashed_rules(chain: iptc.Chain, include_foreign: bool = False):
    for rule in chain.rules:
        comment = next((m.comment for m in rule.matches if m.name == "comment"), None)
        rule_hash = comment_hash(comment) if comment else None
        if rule_hash is not None or include_foreign:
            yield rule, rule_hash


def rule_entry(spec: NatRule):
    """The entry libiptc appends for `spec` (the ipt_entry or ip6t_entry with its
    matches and target, a ctypes array of its own), its python-iptables rule freed.

    A python-iptables rule and its matches and target refer to each other, and
    every ctypes.cast of a ctypes object leaves source and result sharing a dict
    that holds the source: a rule left to itself is garbage only the cyclic
    collector frees, some 55 objects of it. Cold starts of 1,000 load
    balancers handed the collector 6,000-12,000 such objects at each young
    collection (4-63 ms with the interpreter lock held). Unlinked here,
    reference counting frees about half of them at once; the casts python-
    iptables makes inside its own methods remain cyclic."""
    rule = build_rule(spec)
    entry = rule.rule
    for part in (rule, rule.target, *rule.matches):
        for value in vars(part).values():
            shared = getattr(value, "_objects", None)  # a ctypes object's keep-alive dict
            if isinstance(shared, dict):
                shared.clear()
        if part is not rule:
            part.rule = None
    return entry


def build_rule(spec: NatRule) -> iptc.Rule:
    """The python-iptables rule of `spec`, checked (bench/floor.py builds its rules with it too)."""
    # Module options are set with parse(), which is what python-iptables'
    # attribute assignment calls after looking the name up in dir() of the
    # module: a fifth of the cost of building a load balancer's rules.
    load_extensions_for_both_families()
    rule = iptc.Rule6() if spec.family == 6 else iptc.Rule()
    if spec.in_interface:
        rule.in_interface = spec.in_interface
    if spec.out_interface:
        rule.out_interface = spec.out_interface
    if spec.src:
        rule.src = spec.src
    if spec.dst:
        rule.dst = spec.dst
    if spec.protocol:
        rule.protocol = spec.protocol
        if spec.dport:
            rule.create_match(spec.protocol).parse("dport", str(spec.dport))
    if spec.probability:
        statistic = rule.create_match("statistic")
        statistic.parse("mode", "random")
        statistic.parse("probability", spec.probability)
    if spec.mark:
        rule.create_match("mark").parse("mark", spec.mark)
    if spec.ct_orig_dst:
        conntrack = rule.create_match("conntrack")
        conntrack.parse("ctdir", "ORIGINAL")
        conntrack.parse("ctorigdst", spec.ct_orig_dst)
        conntrack.parse("ctorigdstport", str(spec.ct_orig_dport))
    rule.create_match("comment").parse("comment", spec.comment)
    target = rule.create_target(spec.target)
    if spec.target == "DNAT":
        target.parse("to-destination", spec.to)
    elif spec.target == "SNAT":
        target.parse("to-source", spec.to)
    elif spec.target == "HMARK":
        # The source address alone, every other field masked out, said field
        # by field: "--hmark-tuple src" means the same but is saved as just
        # "--hmark-src-prefix 32", which parses back with the other fields in
        # (python-iptables re-parses what it reads before deleting it: it
        # could never delete such a rule).
        target.parse("hmark-src-prefix", HOST_PREFIX[spec.family])
        for option, value in HMARK_SOURCE_ONLY:
            target.parse(option, value)
        target.parse("hmark-rnd", HMARK_SEED)
        target.parse("hmark-mod", str(spec.hmark_mod))
    _final_check(rule)
    return rule


def _final_check(rule: iptc.Rule) -> None:
    """The extensions' final checks (which also complete their data: SNAT's
    range count, for one), without python-iptables' round trip around them:
    `Chain.append_rule` first prints every match and target through the
    extension's save() into a pipe swapped in for C stdout, splits the text
    with shlex and parses it all again, only to restore the flags that the
    parse() calls above have just set; two fifths of the iptables thread's
    time for a new namespace. It must run right after those calls: an
    extension keeps the buffer and flags of the module of its kind built last
    in shared C state. tests/unit/test_iptables.py compares the bytes."""
    for module in (rule.target, *rule.matches):
        if module._module:
            module._final_check()
