"""Alerts in the console: the Prometheus rules' conditions evaluated by beat, with history and a webhook."""
