"""python-iptables, imported without setuptools.

python-iptables asks `distutils.sysconfig` for the site-packages directory (its
last place to look for libxtables), and asks `sysconfig` where there is no
distutils, as on Python 3.12. Where setuptools is installed, its distutils shim
answers that import by loading all of setuptools and pkg_resources: 11 MB of
the agent's resident memory and a tenth of a second of its start, for a path
that `sysconfig` gives as well. So python-iptables is imported with distutils
hidden, unless something imported distutils already.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING


def _import_iptc() -> ModuleType:
    hide = "distutils" not in sys.modules
    if hide:
        sys.modules["distutils"] = None  # type: ignore[assignment]  # import raises ModuleNotFoundError
    try:
        import iptc
        import iptc.xtables  # noqa: F401  # loaded here, under the same condition
    finally:
        if hide:
            del sys.modules["distutils"]
    return iptc


if TYPE_CHECKING:
    import iptc
else:
    iptc = _import_iptc()
