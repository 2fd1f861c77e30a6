"""`inferchain bench`: a load-test tool for any OpenAI-compatible endpoint (docs/bench.md).

It stands alone (no Django, nothing of the console): a user points it at their proxy, a vLLM engine or
another gateway, from any machine with the package installed.
"""
