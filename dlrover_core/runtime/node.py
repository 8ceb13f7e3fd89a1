"""``dlrover-rm node ps|worker|rank ...``: the one command every backend runs for a node.

The arguments (and the backend's environment: identity, bind and advertised host) describe the
node completely; see :mod:`dlrover_core.runtime.strategies.ps.server` and
:mod:`dlrover_core.runtime.strategies.ps.worker` for each role's arguments.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

ROLES = ("ps", "worker", "rank")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ROLES:
        print(
            f"usage: dlrover-rm node {{{'|'.join(ROLES)}}} ARGS... (got {args[:1] or 'nothing'})",
            file=sys.stderr,
        )
        return 2
    role, rest = args[0], args[1:]
    if role == "ps":
        from dlrover_core.runtime.strategies.ps.server import main as ps_main

        return ps_main(rest)
    if role == "rank":  # one rank of an all-reduce group
        from dlrover_core.runtime.strategies.allreduce.agent import main as rank_main

        return rank_main(rest)
    from dlrover_core.runtime.strategies.ps.worker import main as worker_main

    return worker_main(rest)


if __name__ == "__main__":
    sys.exit(main())
