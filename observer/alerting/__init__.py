"""Alerts: rules over records and the pipeline (``rules``), delivered to webhooks and stored
(``delivery``), off the proxy's loop."""
