"""The flight recorder as the sidecar gathers it, the triggers and Alertmanager's alerts (docs/api.md,
"Incidents", "Triggers", "Alerts").

    recorder_dump     every selected process's recorder gathered: one query, each dump file read and deleted
    recorder_clock    a recorder dump moved onto the sidecar's clock, by the rule the merge follows
    recorder_view     the processes' dumps merged into rows and a Chrome trace
    recorder_window   the last minutes kept for the home page, read from the probes a few seconds at a time
    recorder_timeline those minutes made small: step-time buckets, slow steps, GC, requests, marks
    triggers          ``Triggers``: rules checked on each heartbeat and metrics push; a firing saves the recorder and starts a capture
    firing            what a firing does, a trigger's or an alert's: the capture, the recorder dump, the scan
    alerts            ``Alerts``: Alertmanager's alerts (POST /alerts) decided one by one, fired as a trigger's firings
    alert_actions     which alerts the sidecar acts on and how (--alert-actions), and which are this server's
    alert_payload     Alertmanager's webhook body (version 4), checked field by field
    trigger_rules     a trigger's rule, parsed from JSON once
    trigger_limits    how often a trigger may fire: a cooldown and an hourly budget
    histogram_window  a percentile of a pushed histogram over a recent window
"""
