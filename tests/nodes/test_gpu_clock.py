"""GPU samples keep their 1 Hz while an engine on the host hangs (issue 21, item 7).

The engine here is a process that exists (so the supervisor probes it) behind a port that accepts
connections and never answers: every probe waits out its 1 s timeout, so one engine round takes about
3 s (health, metrics, /sim/gpu). Before the GPU clock, the host's GPU feed slowed to that pace.
"""

from __future__ import annotations

import itertools
import socket
import subprocess
import time
from typing import Any

import pytest

from nodes import history
from nodes.choices import DeploymentState
from nodes.models import Deployment, Host
from tests.nodes.conftest import supervisor_for


@pytest.mark.django_db(transaction=True)
def test_gpu_feed_keeps_1hz_while_an_engine_hangs(
    host: Host, make_deployment: Any, redis_clean: None
) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # connections complete in the backlog; nothing ever reads or answers them
    # A session of its own, as the runtime starts engines: the hang verdict's kill signals the engine's
    # process group. In the test's group, that signal found no group, the kill waited out its 5 + 5 s,
    # and the tick outlived close()'s join, writing to the database during the test's teardown.
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    deployment: Deployment = make_deployment(port=silent.getsockname()[1])
    Deployment.objects.filter(pk=deployment.pk).update(
        state=DeploymentState.READY, pid=sleeper.pid, start_token="t"
    )
    supervisor = supervisor_for(host)
    seconds = 6.0
    try:
        began = time.time()
        supervisor.start_loop()
        time.sleep(seconds)
    finally:
        leaked = supervisor.close()
        sleeper.kill()
        sleeper.wait()
        silent.close()

    assert not leaked, f"supervisor threads still running after close(): {leaked}"
    gpus, engines = history.read([(host.name, 0)], [deployment.pk], minutes=1)
    gpu_ts = [t for t in gpus[(host.name, 0)].t if t >= began]
    engine_ts = engines[deployment.pk].t
    gaps = [b - a for a, b in itertools.pairwise(gpu_ts)]
    # ~1 Hz: six or seven samples in six seconds, none more than 1.3 s apart.
    assert len(gpu_ts) >= seconds - 1, gpu_ts
    assert max(gaps) < 1.3, gaps
    # ...while the hung engine's rounds took ~3 s each (so the old single loop would have made ~2).
    assert 1 <= len(engine_ts) <= 3, engine_ts
    host.refresh_from_db()
    assert host.last_heartbeat is not None and host.last_heartbeat.timestamp() >= began
