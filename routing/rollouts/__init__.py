"""Canary rollouts and shadow configs: the control plane (docs/rollouts.md).

`plans` checks a plan's steps and gates, `gates` measures a step's window and decides, `signoff` says
whether the candidate has an accepted offline evaluation, `services` applies every change through one
`transition()` (decision history, audit, pub/sub). The data plane (the proxy's canary draw and
shadow mirroring) reads the same Rollout and ShadowConfig rows from its config snapshot.
"""
