"""The probe channel's sidecar half (its websocket handler is sidecar/service/routes/probe_channel.py).

    registry       the connected probes (heartbeats, watchdog reports, requests in flight) and those lost lately;
                   the step alarm each probe is sent (the single-event step rules' lowest threshold)
    clock_sync     each probe's clock offset from the channel's round trips (NTP's clock filter)
    file_fetch     a probe's files fetched over the channel (another host), checked by size and SHA-256
    queries        one query to every probe with one deadline, the answers matched by id
    query_slots    one costly query (stacks, recorder) at a time per engine process
    watch_reports  a probe's sync watch report checked for its shape before the registry keeps it
"""
