"""``gpuguard hub serve`` with the hub's clock stopped at a given time: ``python -m tests.hub.clocked_hub --config
PATH --now ISO``, as :class:`tests.hub.process.HubProcess` runs it when given ``now``.

The server is the real one (agent/hub/server.py's ``serve``, workers and all); only the app's ``clock`` is fixed, so
what the pages call stale or recent depends on the data a test seeded, not on how long the test took to get there.
"""

from __future__ import annotations

import argparse
import datetime as dt
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    from agent.hub.server import serve
    from agent.hub.settings import load_hub_settings
    from agent.log import configure

    parser = argparse.ArgumentParser(prog="clocked_hub")
    parser.add_argument("--config", required=True)
    parser.add_argument("--now", required=True, type=dt.datetime.fromisoformat, help="aware ISO 8601 time")
    args = parser.parse_args(argv)
    now: dt.datetime = args.now
    if now.tzinfo is None:
        parser.error("--now needs a time zone")
    settings = load_hub_settings(args.config, required=True)
    configure(level=settings.log_level)
    serve(settings, clock=lambda: now)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
