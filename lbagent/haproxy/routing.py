"""Where an HTTP request goes: host/path rules (the most specific wins) and redirects.

A rule matches on the request's host (exact, or `*.suffix`), its path prefix,
or both. Rules are tried from the most specific to the least: an exact domain
beats a wildcard (a longer wildcard suffix beats a shorter one) beats no
domain, and between equal domains a longer path prefix wins. The first match
names the rule in a transaction variable; that rule's redirect or backend is
used, and requests no rule matches get the listener's redirect or its default
backend. Choosing first and acting after keeps "most specific wins" true even
though haproxy runs every redirect before it considers any backend.

A redirect keeps whatever part of the request it does not set: the scheme
(the listener's own), the host (the request's Host header, port included),
the path and the query. A new path replaces the request's path; the query
still follows it.
"""

from __future__ import annotations

from dataclasses import dataclass

from lbagent.haproxy.errors import RenderError

RULE_VARIABLE = "txn.lbagent_rule"
REDIRECT_CODES = frozenset({301, 302, 307})
# Log-format expressions for the parts a redirect keeps from the request.
REQUEST_HOST = "%[req.hdr(host)]"
REQUEST_PATH_AND_QUERY = "%[pathq]"
REQUEST_QUERY = "%[query]"


@dataclass(frozen=True)
class RedirectView:
    code: int
    scheme: str | None  # set: only the scheme changes ("redirect scheme"); the locations are None
    location: str | None  # log-format, used when the request has no query (or keeps it itself)
    location_with_query: str | None  # log-format, used when the request has a query; None: same as location


@dataclass(frozen=True)
class RuleView:
    id: str
    host_exact: str | None
    host_suffix: str | None  # ".example.com" for "*.example.com"
    path_prefix: str | None
    backend: str | None
    redirect: RedirectView | None


def redirect_view(redirect, own_scheme: str) -> RedirectView:
    """haproxy's terms for an api.md redirect on a listener whose scheme is `own_scheme`."""
    if redirect.code not in REDIRECT_CODES:
        raise RenderError(f"unsupported redirect code: {redirect.code!r}")
    scheme, host, path = redirect.scheme, redirect.host, redirect.path
    if scheme and not host and not path:
        return RedirectView(redirect.code, scheme, None, None)
    # With neither scheme nor host the location is relative: the client keeps
    # both, and a request without a Host header still gets a valid location.
    origin = f"{scheme or own_scheme}://{_literal(host) if host else REQUEST_HOST}" if scheme or host else ""
    if not path:
        return RedirectView(redirect.code, None, origin + REQUEST_PATH_AND_QUERY, None)
    location = origin + _literal(path)
    return RedirectView(redirect.code, None, location, f"{location}?{REQUEST_QUERY}")


def _literal(text: str) -> str:
    # '%' starts an expression in haproxy's log-format strings.
    return text.replace("%", "%%")


def _specificity(rule) -> tuple[int, int, int]:
    domain = rule.domain
    if not domain:
        domain_rank = (0, 0)
    elif domain.startswith("*."):
        domain_rank = (1, len(domain))
    else:
        domain_rank = (2, 0)
    return (*domain_rank, len(rule.path))


def rule_views(rules, backend_name_of, own_scheme: str) -> tuple[RuleView, ...]:
    """The listener's rules, most specific first (ties keep the order given)."""
    ordered = sorted(rules, key=_specificity, reverse=True)
    views = []
    for rule in ordered:
        domain = rule.domain or None
        wildcard = domain is not None and domain.startswith("*.")
        views.append(
            RuleView(
                id=rule.id,
                host_exact=None if wildcard else domain,
                host_suffix=domain[1:] if wildcard and domain is not None else None,
                path_prefix=rule.path or None,
                backend=backend_name_of(rule) if rule.redirect is None else None,
                redirect=redirect_view(rule.redirect, own_scheme) if rule.redirect is not None else None,
            )
        )
    return tuple(views)
