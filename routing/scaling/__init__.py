"""A pool's capacity policies: scale its engines with load, and put its idle engines to sleep.

Both are decisions per RoutePool, taken on the live state the agents report; both act through the
nodes app (routing -> nodes, never back): the autoscaler places and drains engines with
nodes.services.request_start/request_stop, idle sleep asks with nodes.services.request_sleep, and the
agent does the work (nodes.agent.runtime). Waking one engine is a node operation too
(nodes.lifecycle.request_wake; the proxy asks for it, routing/proxy/wake.py).

- `autoscaler`: the pool autoscaler (read the pool, `decide`, place or drain, record), docs/autoscaling.md;
- `sleep`: idle sleep and scale to zero (`sleep_idle_engines`, `enable_sleep_for_pool`), docs/nodes.md;
- `models`: ScalingPolicy and ScalingDecision (registered with the app by routing/models.py);
- `api`: /api/scaling-policies/ (serializers and viewset; routed by routing/api/urls.py);
- `tasks`: the beat tasks of both (imported by routing/tasks.py, which Celery discovers).
"""
