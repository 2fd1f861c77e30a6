"""`python -m nodes.agent --host NAME`: the node agent of a fleet host (see nodes/agent/remote.py).

It reaches the control plane through the agent channel only; it needs no DATABASE_URL and never
imports Django. (`manage.py run_agent` is the co-located agent for a single-machine install.)
"""

from __future__ import annotations

from nodes.agent.remote import main

if __name__ == "__main__":
    main()
