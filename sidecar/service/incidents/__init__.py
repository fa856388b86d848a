"""The flight recorder as the sidecar gathers it, and the triggers (docs/api.md, "Incidents", "Triggers").

    recorder_dump     every selected process's recorder gathered: one query, each dump file read and deleted
    recorder_clock    a recorder dump moved onto the sidecar's clock, by the rule the merge follows
    recorder_view     the processes' dumps merged into rows and a Chrome trace
    triggers          ``Triggers``: rules checked on each heartbeat and metrics push; a firing saves the recorder and starts a capture
    trigger_rules     a trigger's rule, parsed from JSON once
    trigger_limits    how often a trigger may fire: a cooldown and an hourly budget
    histogram_window  a percentile of a pushed histogram over a recent window
"""
